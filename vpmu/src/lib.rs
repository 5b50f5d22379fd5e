//! vPMU model (filled in by the vPMU issue).
