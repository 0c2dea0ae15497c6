//! Test-only code that more than one test uses and that is no part of a running Ember, kept
//! out of the production crates.

pub mod uffd_handler;
