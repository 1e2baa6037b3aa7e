//! vm-tests harness
