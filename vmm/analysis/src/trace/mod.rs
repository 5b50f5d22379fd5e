//! The trace file: its layout ([`format`]), readers ([`read`]), the xenalyze-style summaries
//! ([`summary`]) and the `--interval` CSV series with its SVG chart ([`series`]).

pub mod format;
pub mod read;
pub mod series;
pub mod summary;
