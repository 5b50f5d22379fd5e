//! `vpmu-vmm report`: placeholder until the symbolizer lands.

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("not implemented yet")]
    NotYet,
}

pub fn command(_args: &crate::cli::ReportArgs) -> Result<(), ReportError> {
    Err(ReportError::NotYet)
}
