//! One module per subcommand.

pub mod chat;
pub mod common;
pub mod generate;
pub mod gpu_bench;
pub mod gpu_check;
pub mod inspect;
pub mod logits;
pub mod qualify;
pub mod serve;
pub mod switches;
