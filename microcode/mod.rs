//! The shipped Microcode programs. They use only pfemu's public API, exactly as a user's
//! program would, so each is also an example of how to write one.

pub mod filter;
pub mod fpisa;
pub mod l3fwd;
pub mod nimble;
pub mod trio_ml;
