//! pfemu's shipped programs, compiled against the engine's public API alone.
//!
//! pfemu includes these files as its `microcode` module; this crate compiles them once more
//! as a user's crate would, depending on `pfemu` without its `lab` feature, so that a program
//! reaching for anything the engine does not export fails to build. Use the programs through
//! `pfemu::microcode`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[path = "mod.rs"]
pub mod microcode;
