//! `--disk` and `--disk-access-cost-us`, as `run` and `compare` both take them.

use std::path::PathBuf;

use runtime::host_quirks::HostKind;

/// One `--disk PATH[,readonly=on|off]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskArg {
    pub path: PathBuf,
    pub readonly: bool,
}

/// Why a `--disk` value was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiskArgError {
    #[error("no image path (PATH[,readonly=on])")]
    NoPath,
    #[error("unknown disk option {0:?} (known: readonly=on|off)")]
    UnknownOption(String),
}

/// `--disk PATH[,readonly=on|off]` (a path with a comma in it cannot be given).
pub fn parse_disk(s: &str) -> Result<DiskArg, DiskArgError> {
    let mut parts = s.split(',');
    let path = parts.next().unwrap_or_default();
    if path.is_empty() {
        return Err(DiskArgError::NoPath);
    }
    let mut readonly = false;
    for opt in parts {
        readonly = match opt {
            "readonly=on" | "readonly" => true,
            "readonly=off" => false,
            _ => return Err(DiskArgError::UnknownOption(opt.to_string())),
        };
    }
    Ok(DiskArg {
        path: PathBuf::from(path),
        readonly,
    })
}

/// `--disk-access-cost-us`, as asked, else by host: 0 where guest kernel code runs natively,
/// more where it is emulated ([`HostKind::default_access_cost_us`]).
pub fn disk_access_cost(asked: Option<u32>, host: HostKind) -> u32 {
    asked.unwrap_or_else(|| host.default_access_cost_us())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_options() {
        let d = parse_disk("/img/a.img").unwrap();
        assert_eq!((d.path, d.readonly), (PathBuf::from("/img/a.img"), false));
        assert!(parse_disk("a.img,readonly=on").unwrap().readonly);
        assert!(
            !parse_disk("a.img,readonly=on,readonly=off")
                .unwrap()
                .readonly
        );
        let e = parse_disk("a.img,ro").unwrap_err().to_string();
        assert!(e.contains("unknown disk option \"ro\""), "{e}");
        assert_eq!(parse_disk(",readonly=on"), Err(DiskArgError::NoPath));
    }
}
