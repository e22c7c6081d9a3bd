//! Launchers for the attention family (being written): sparse attention, compressors, indexer.

/// Entry points of `kernels/attention.cu`.
pub const ATTENTION_ENTRY_POINTS: &[&str] = &["attention_placeholder"];
/// Entry points of `kernels/compressor.cu`.
pub const COMPRESSOR_ENTRY_POINTS: &[&str] = &["compressor_placeholder"];
/// Entry points of `kernels/indexer.cu`.
pub const INDEXER_ENTRY_POINTS: &[&str] = &["indexer_placeholder"];
