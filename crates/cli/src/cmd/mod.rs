//! One module per verb.
pub mod schedule;
pub mod sim;
