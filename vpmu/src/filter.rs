//! The operator's event filter: which events a guest may count, as KVM's
//! `KVM_SET_PMU_EVENT_FILTER` (Documentation/virt/kvm/api.rst; arch/x86/kvm/pmu.c,
//! `check_pmu_event_filter`).
//!
//! A filter is an action (allow or deny), a list of general-purpose-counter events (event select,
//! optionally with a unit mask) and a bitmap of Intel fixed counters:
//!
//! - a general-purpose counter's event is *listed* when an entry has its event select (8 bits on
//!   Intel; 12 bits on AMD, EventSelect\[11:8\] from bits 35:32) and, if the entry gives one, its
//!   unit mask. `allow`: only listed events count; `deny`: listed events do not.
//! - fixed counter i is governed by bit i of the bitmap alone (as in KVM, whatever the list says):
//!   `allow`: counts only with its bit set; `deny`: does not count with its bit set. So
//!   `allow:0x3c` without `fixed=` also stops every fixed counter, as KVM does.
//!
//! A filtered counter is still programmed as far as the guest can see: its select register reads
//! back what was written, its value stays where it was (written values included); only the
//! backend never counts for it ([`crate::CounterBackend::program`] is not called). The counter
//! core counts such refusals ([`crate::Pmu::filter_blocked`]).
//!
//! # Text form (`--pmu-event-filter SPEC`)
//!
//! ```text
//! SPEC   = ACTION ":" [ITEM {SEP ITEM}]
//! ACTION = "allow" | "deny"
//! ITEM   = EVENT ["/" UMASK] | "fixed=" BITMAP
//! SEP    = "," or white space (newlines included); "#" starts a comment to the end of the line
//! ```
//! Numbers are hexadecimal with `0x` or decimal: EVENT 0..=0xfff, UMASK 0..=0xff, BITMAP 0..=0x7
//! (bit i = fixed counter i). An EVENT without `/UMASK` matches every unit mask of that event
//! select (KVM's plain entries always compare the unit mask; this is its masked-entry form with
//! a zero mask). At most [`MAX_EVENTS`] entries, as KVM. E.g. `allow:0x3c,0xc0/0x00,fixed=0x3`,
//! `deny:0x76,0xc0`.

use std::fmt;
use std::str::FromStr;

use crate::Event;

/// Entries a filter may list (KVM's `KVM_PMU_EVENT_FILTER_MAX_EVENTS`).
pub const MAX_EVENTS: usize = 300;
/// Largest event select (AMD's 12 bits).
pub const MAX_EVENT_SELECT: u16 = 0xfff;
/// Fixed-counter bits a filter may name (the model has at most 3 fixed counters).
pub const FIXED_BITS: u32 = 0x7;

/// What a filter does with the events it lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FilterAction {
    /// Only the listed events (and fixed counters) count.
    Allow,
    /// The listed events (and fixed counters) do not count.
    Deny,
}

/// One listed event: an event select and, optionally, a unit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventMatch {
    /// Event select (Intel 8 bits; AMD 12 bits).
    pub select: u16,
    /// Unit mask; `None` matches every unit mask.
    pub umask: Option<u8>,
}

impl EventMatch {
    /// Whether a general-purpose counter's event is this entry.
    pub fn matches(&self, e: &Event) -> bool {
        e.code == self.select && self.umask.is_none_or(|u| u == e.umask)
    }
}

/// A `--pmu-event-filter`: see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFilter {
    action: FilterAction,
    /// Sorted, without duplicates.
    events: Vec<EventMatch>,
    fixed: u32,
}

/// A filter that cannot be built (a bad SPEC: the message names the offending item).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// The text does not start with `allow:` or `deny:`.
    #[error("a filter starts with \"allow:\" or \"deny:\", not {0:?}")]
    Action(String),
    /// An item that is not a number where one is needed.
    #[error("{item:?}: {what} is not a number (write hex as 0x3c, or decimal)")]
    Number {
        /// The item as written.
        item: String,
        /// Which part (event select, unit mask, fixed-counter bitmap).
        what: &'static str,
    },
    /// A number out of range.
    #[error("{item:?}: {what} {value:#x} is out of range (at most {max:#x})")]
    Range {
        /// The item as written.
        item: String,
        /// Which part.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// `fixed=` given twice.
    #[error("\"fixed=\" given more than once")]
    FixedTwice,
    /// More entries than [`MAX_EVENTS`].
    #[error("{0} events listed: at most {MAX_EVENTS}")]
    TooMany(usize),
}

impl EventFilter {
    /// A filter; `fixed` bit i governs fixed counter i.
    pub fn new(
        action: FilterAction,
        events: impl IntoIterator<Item = EventMatch>,
        fixed: u32,
    ) -> Result<EventFilter, FilterError> {
        let mut events: Vec<EventMatch> = events.into_iter().collect();
        if events.len() > MAX_EVENTS {
            return Err(FilterError::TooMany(events.len()));
        }
        for m in &events {
            if m.select > MAX_EVENT_SELECT {
                return Err(FilterError::Range {
                    item: format!("{:#x}", m.select),
                    what: "event select",
                    value: m.select.into(),
                    max: MAX_EVENT_SELECT.into(),
                });
            }
        }
        if fixed & !FIXED_BITS != 0 {
            return Err(FilterError::Range {
                item: format!("fixed={fixed:#x}"),
                what: "fixed-counter bitmap",
                value: fixed.into(),
                max: FIXED_BITS.into(),
            });
        }
        events.sort_unstable();
        events.dedup();
        Ok(EventFilter {
            action,
            events,
            fixed,
        })
    }

    /// Allow or deny.
    pub fn action(&self) -> FilterAction {
        self.action
    }

    /// The listed events, sorted.
    pub fn events(&self) -> &[EventMatch] {
        &self.events
    }

    /// The fixed-counter bitmap (bit i = fixed counter i).
    pub fn fixed_bitmap(&self) -> u32 {
        self.fixed
    }

    /// Whether a counter programmed with `e` may count (KVM's `check_pmu_event_filter`): a fixed
    /// counter by its bitmap bit, a general-purpose one by the list.
    pub fn allows(&self, e: &Event) -> bool {
        let listed = match e.fixed {
            Some(i) => u32::from(i) < 32 && self.fixed & (1 << i) != 0,
            None => self.events.iter().any(|m| m.matches(e)),
        };
        match self.action {
            FilterAction::Allow => listed,
            FilterAction::Deny => !listed,
        }
    }
}

/// Parses a number: `0x` hex or decimal.
fn number(item: &str, text: &str, what: &'static str, max: u64) -> Result<u64, FilterError> {
    let bad = || FilterError::Number {
        item: item.to_string(),
        what,
    };
    let v = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() => u64::from_str_radix(hex, 16).map_err(|_| bad())?,
        Some(_) => return Err(bad()),
        None if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            text.parse().map_err(|_| bad())?
        }
        None => return Err(bad()),
    };
    if v > max {
        return Err(FilterError::Range {
            item: item.to_string(),
            what,
            value: v,
            max,
        });
    }
    Ok(v)
}

impl FromStr for EventFilter {
    type Err = FilterError;

    /// The text form of the [module docs](self) (inline, or a whole file with comments).
    fn from_str(text: &str) -> Result<EventFilter, FilterError> {
        let body: String = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let body = body.trim_start();
        let (action, rest) = match body.split_once(':') {
            Some((a, rest)) if a.trim().eq_ignore_ascii_case("allow") => {
                (FilterAction::Allow, rest)
            }
            Some((a, rest)) if a.trim().eq_ignore_ascii_case("deny") => (FilterAction::Deny, rest),
            _ => {
                let start: String = body.chars().take(20).collect();
                return Err(FilterError::Action(start));
            }
        };
        let mut events = Vec::new();
        let mut listed = 0;
        let mut fixed = None;
        for item in rest
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            if let Some(bits) = item.strip_prefix("fixed=") {
                if fixed.is_some() {
                    return Err(FilterError::FixedTwice);
                }
                let what = "fixed-counter bitmap";
                fixed = Some(number(item, bits, what, FIXED_BITS.into())? as u32);
                continue;
            }
            let (sel, umask) = match item.split_once('/') {
                Some((s, u)) => (s, Some(u)),
                None => (item, None),
            };
            let select = number(item, sel, "event select", MAX_EVENT_SELECT.into())? as u16;
            let umask = umask
                .map(|u| number(item, u, "unit mask", 0xff).map(|v| v as u8))
                .transpose()?;
            listed += 1;
            // Every item is checked, but the list never grows past what may be kept.
            if events.len() < MAX_EVENTS {
                events.push(EventMatch { select, umask });
            }
        }
        if listed > MAX_EVENTS {
            return Err(FilterError::TooMany(listed));
        }
        EventFilter::new(action, events, fixed.unwrap_or(0))
    }
}

impl fmt::Display for EventFilter {
    /// The canonical text form, e.g. `allow:0x3c,0xc0/0x0,fixed=0x3`; parses back to `self`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match self.action {
            FilterAction::Allow => "allow",
            FilterAction::Deny => "deny",
        };
        let mut items: Vec<String> = self
            .events
            .iter()
            .map(|m| match m.umask {
                Some(u) => format!("{:#x}/{u:#04x}", m.select),
                None => format!("{:#x}", m.select),
            })
            .collect();
        items.push(format!("fixed={:#x}", self.fixed));
        write!(f, "{action}:{}", items.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> EventFilter {
        s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn parses_the_documented_examples() {
        let f = parse("allow:0x3c,0xc0/0x00,fixed=0x3");
        assert_eq!(f.action(), FilterAction::Allow);
        assert_eq!(
            f.events(),
            &[
                EventMatch {
                    select: 0x3c,
                    umask: None
                },
                EventMatch {
                    select: 0xc0,
                    umask: Some(0)
                }
            ]
        );
        assert_eq!(f.fixed_bitmap(), 3);
        let d = parse("deny:0x76,0xc0");
        assert_eq!(d.action(), FilterAction::Deny);
        assert_eq!(d.events().len(), 2);
        assert_eq!(d.fixed_bitmap(), 0);
    }

    #[test]
    fn file_form_takes_comments_newlines_and_decimal() {
        let f = parse(
            "# operator policy\nDeny:\n  0x176   # a 12-bit AMD select\n  60/1, fixed=4 # ref cycles\n",
        );
        assert_eq!(f.action(), FilterAction::Deny);
        assert_eq!(
            f.events()[0],
            EventMatch {
                select: 0x3c,
                umask: Some(1)
            }
        );
        assert_eq!(f.events()[1].select, 0x176);
        assert_eq!(f.fixed_bitmap(), 4);
    }

    #[test]
    fn empty_lists_are_filters_too() {
        assert!(parse("allow:").events().is_empty());
        assert!(parse("deny:  ").events().is_empty());
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "allow:0x3c,0xc0/0x00,fixed=0x3",
            "deny:",
            "deny:0xfff/0xff,0x2e",
        ] {
            let f = parse(s);
            assert_eq!(parse(&f.to_string()), f, "{s} -> {f}");
        }
        assert_eq!(
            parse("allow:0xc0/0,0x3c,0x3c").to_string(),
            "allow:0x3c,0xc0/0x00,fixed=0x0"
        );
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let err = |s: &str| s.parse::<EventFilter>().unwrap_err().to_string();
        assert!(err("0x3c").contains("allow:"), "{}", err("0x3c"));
        assert!(err("permit:0x3c").contains("\"permit"));
        assert!(err("allow:c0").contains("\"c0\": event select is not a number"));
        assert!(err("allow:0x").contains("not a number"));
        assert!(err("allow:0x3c/").contains("unit mask is not a number"));
        assert!(err("allow:0x1000").contains("out of range (at most 0xfff)"));
        assert!(err("allow:0x3c/0x100").contains("unit mask 0x100 is out of range"));
        assert!(err("allow:fixed=0x8").contains("fixed-counter bitmap 0x8"));
        assert!(err("allow:fixed=1,fixed=2").contains("more than once"));
        assert!(err("deny:-1").contains("not a number"));
        assert!(err("deny:99999999999999999999999").contains("not a number"));
        let many: Vec<String> = (0..=MAX_EVENTS).map(|i| i.to_string()).collect();
        assert!(err(&format!("deny:{}", many.join(","))).contains("at most 300"));
        let ok: Vec<String> = (0..MAX_EVENTS).map(|i| i.to_string()).collect();
        assert_eq!(
            parse(&format!("deny:{}", ok.join(","))).events().len(),
            MAX_EVENTS
        );
    }

    fn gp(vendor: crate::Vendor, code: u16, umask: u8) -> Event {
        Event {
            code,
            umask,
            ..Event::arch(vendor, crate::ArchEvent::CoreCycles).unwrap()
        }
    }

    #[test]
    fn gp_events_match_select_and_optional_umask() {
        use crate::Vendor::*;
        let f = parse("allow:0x3c/0x00,0x2e");
        assert!(f.allows(&gp(Intel, 0x3c, 0)));
        assert!(!f.allows(&gp(Intel, 0x3c, 1)), "umask given: exact");
        assert!(f.allows(&gp(Intel, 0x2e, 0x41)), "no umask: any");
        assert!(f.allows(&gp(Intel, 0x2e, 0x4f)));
        assert!(!f.allows(&gp(Intel, 0xc0, 0)));
        let d = parse("deny:0x3c/0x00,0x2e");
        assert!(!d.allows(&gp(Intel, 0x3c, 0)));
        assert!(d.allows(&gp(Intel, 0x3c, 1)));
        assert!(!d.allows(&gp(Intel, 0x2e, 0x41)));
        assert!(d.allows(&gp(Intel, 0xc0, 0)));
    }

    #[test]
    fn amd_selects_compare_all_12_bits() {
        use crate::Vendor::Amd;
        let f = parse("deny:0x176");
        assert!(f.allows(&gp(Amd, 0x76, 0)));
        assert!(!f.allows(&gp(Amd, 0x176, 0)));
        assert!(parse("deny:0x76").allows(&gp(Amd, 0x176, 0)));
    }

    #[test]
    fn fixed_counters_follow_the_bitmap_only() {
        let fixed = |i| Event::intel_fixed(i, true, true);
        // The list names fixed counter 1's event (0x3c/0x00): the bitmap still decides.
        let a = parse("allow:0x3c/0x00,fixed=0x5");
        let d = parse("deny:0x3c/0x00,fixed=0x5");
        for i in 0..3u8 {
            let bit = 0x5 & (1 << i) != 0;
            assert_eq!(a.allows(&fixed(i)), bit, "allow fixed{i}");
            assert_eq!(d.allows(&fixed(i)), !bit, "deny fixed{i}");
        }
    }
}
