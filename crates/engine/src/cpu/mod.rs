//! Exact CPU primitives for the reference forward pass: f32 storage, f64 accumulation, and a
//! fixed reduction order (so results do not depend on thread count or scheduling).

pub mod ops;
pub mod rope;
