//! One way to add up statistics: per-vCPU counts merged into the VM's totals.
//!
//! Each kind of value says once how two of it merge ([`Merge`]): counts add, flags OR, lists
//! append, [`Distinct`] lists keep each item once, arrays merge element by element. A
//! statistics struct then merges field by field with [`merge_fields!`](crate::merge_fields),
//! which names every field: a field added to the struct and not to the list is a compile error.

/// Two values of one statistic merged into one.
pub trait Merge {
    fn merge(&mut self, other: &Self);
}

impl Merge for u64 {
    fn merge(&mut self, other: &Self) {
        *self += other;
    }
}

impl Merge for bool {
    fn merge(&mut self, other: &Self) {
        *self |= other;
    }
}

impl<T: Merge, const N: usize> Merge for [T; N] {
    fn merge(&mut self, other: &Self) {
        for (a, b) in self.iter_mut().zip(other) {
            a.merge(b);
        }
    }
}

impl<T: Clone> Merge for Vec<T> {
    fn merge(&mut self, other: &Self) {
        self.extend_from_slice(other);
    }
}

/// A list that holds each item once (merging appends only what it lacks, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distinct<T>(pub Vec<T>);

impl<T> Default for Distinct<T> {
    fn default() -> Self {
        Distinct(Vec::new())
    }
}

impl<T> std::ops::Deref for Distinct<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Clone + PartialEq> Merge for Distinct<T> {
    fn merge(&mut self, other: &Self) {
        for x in &other.0 {
            if !self.0.contains(x) {
                self.0.push(x.clone());
            }
        }
    }
}

/// `impl Merge for TYPE` field by field; every field must be named (no `..`).
#[macro_export]
macro_rules! merge_fields {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl $crate::merge::Merge for $ty {
            fn merge(&mut self, other: &Self) {
                let $ty { $($field),* } = self;
                $( $crate::merge::Merge::merge($field, &other.$field); )*
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq)]
    struct Stats {
        n: u64,
        seen: bool,
        per: [u64; 2],
        log: Vec<u8>,
        names: Distinct<&'static str>,
    }
    crate::merge_fields!(Stats {
        n,
        seen,
        per,
        log,
        names
    });

    #[test]
    fn each_kind_merges_by_its_rule() {
        let mut a = Stats {
            n: 1,
            seen: false,
            per: [1, 2],
            log: vec![1],
            names: Distinct(vec!["x"]),
        };
        let b = Stats {
            n: 2,
            seen: true,
            per: [10, 20],
            log: vec![2, 3],
            names: Distinct(vec!["y", "x"]),
        };
        a.merge(&b);
        assert_eq!(
            a,
            Stats {
                n: 3,
                seen: true,
                per: [11, 22],
                log: vec![1, 2, 3],
                names: Distinct(vec!["x", "y"]),
            }
        );
        a.merge(&Stats::default());
        assert_eq!(
            (a.n, a.seen, a.log.len()),
            (3, true, 3),
            "an empty one adds nothing"
        );
    }
}
