//! What the operator asked for: the command line (clap only), and the validated settings
//! every other layer is built from. Every user mistake is caught here, once, with a line
//! that says what to change.

pub mod cli;
pub mod config;
pub mod file;
pub mod units;
