//! `pfemu experiment pipelines`: the shipped programs on the dRMT paper's pipelines (Chole
//! et al., SIGCOMM 2017) and on pfemu's run-to-completion PFE. So far the PFE's side:
//! [`pfe_profile`], a shipped program's instructions and XTXNs per packet measured on a
//! running engine.

mod pfe;

pub use pfe::{pfe_profile, PfeProfile};
