//! One module per verb.
pub mod schedule;
pub mod sim;
pub mod check;
pub mod fmt;
