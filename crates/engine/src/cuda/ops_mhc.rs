//! Launchers for the mHC and MoE families (being written).

/// Entry points of `kernels/mhc.cu`.
pub const MHC_ENTRY_POINTS: &[&str] = &["mhc_placeholder"];
/// Entry points of `kernels/moe.cu`.
pub const MOE_ENTRY_POINTS: &[&str] = &["moe_placeholder"];
