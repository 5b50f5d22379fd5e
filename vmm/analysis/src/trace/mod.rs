//! The trace file: its layout ([`format`]), readers ([`read`]), the xenalyze-style summaries
//! ([`summary`]), the `--interval` CSV series with its SVG chart ([`series`]) and the
//! `trace summary` command ([`command`]).

pub mod command;
pub mod format;
pub mod read;
pub mod series;
pub mod summary;
