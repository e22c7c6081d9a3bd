//! Errors of the checkpoint reader/writer. Every variant names the file and/or tensor involved and,
//! where it applies, what was expected and what was found.

use std::path::PathBuf;

use crate::quant::QuantError;

/// Error opening, validating or decoding a safetensors checkpoint.
///
/// Bad input never panics; it produces one of these. Display messages are written for people: they
/// name the file (`file`/`index`/`path`) and the tensor, and state the expectation and the finding.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// An OS-level I/O failure (open, stat, mmap, read dir, write).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The path does not exist, or a directory holds no `*.safetensors` files.
    #[error("no checkpoint at {path}: {detail}")]
    NotFound {
        /// The path given to [`super::Checkpoint::open`].
        path: PathBuf,
        /// What was looked for.
        detail: String,
    },
    /// The file is shorter than the 8-byte header-length prefix.
    #[error("{file}: truncated safetensors file: {len} bytes, expected at least 8 (header length prefix)")]
    Truncated {
        /// The shard.
        file: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// The header length prefix points past the end of the file.
    #[error("{file}: header length {header_len} + 8 exceeds the file size {file_len} bytes (truncated or corrupt)")]
    HeaderTooLarge {
        /// The shard.
        file: PathBuf,
        /// The declared JSON header length.
        header_len: u64,
        /// The actual file size.
        file_len: u64,
    },
    /// The JSON header is not valid UTF-8/JSON or does not have the safetensors structure.
    #[error("{file}: corrupt safetensors header: {detail}")]
    BadHeader {
        /// The shard.
        file: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A tensor's `data_offsets` are reversed, outside the data section, or do not match dtype x shape.
    #[error("{file}: tensor `{tensor}`: bad data offsets: {detail}")]
    BadOffsets {
        /// The shard.
        file: PathBuf,
        /// The stored tensor name.
        tensor: String,
        /// Expected vs found.
        detail: String,
    },
    /// `model.safetensors.index.json` is unreadable or malformed.
    #[error("{index}: bad safetensors index: {detail}")]
    BadIndex {
        /// The index file.
        index: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The index maps a tensor to a shard file that does not exist.
    #[error("{index}: tensor `{tensor}` is mapped to shard {shard}, which does not exist")]
    MissingShard {
        /// The index file.
        index: PathBuf,
        /// The missing shard path.
        shard: PathBuf,
        /// The first tensor mapped to it.
        tensor: String,
    },
    /// The index maps a tensor to a shard whose header lacks it.
    #[error(
        "{index}: tensor `{tensor}` is mapped to shard {shard}, but that shard has no such tensor"
    )]
    IndexTensorMissing {
        /// The index file.
        index: PathBuf,
        /// The shard that lacks it.
        shard: PathBuf,
        /// The stored tensor name.
        tensor: String,
    },
    /// The same stored tensor (or two stored tensors with the same canonical name) appears twice.
    #[error("duplicate tensor `{tensor}`: stored as `{first_name}` in {first} and as `{second_name}` in {second}")]
    DuplicateTensor {
        /// The canonical (or stored, for shard-level duplicates) name.
        tensor: String,
        /// Stored name of the first occurrence.
        first_name: String,
        /// File of the first occurrence.
        first: PathBuf,
        /// Stored name of the second occurrence.
        second_name: String,
        /// File of the second occurrence.
        second: PathBuf,
    },
    /// Naming-scheme detection failed: mixed schemes, ambiguity, or no recognizable names (spec §2).
    #[error("{file}: tensor `{tensor}`: {detail}")]
    Scheme {
        /// File of the offending tensor.
        file: PathBuf,
        /// The offending stored tensor name.
        tensor: String,
        /// Expected vs found.
        detail: String,
    },
    /// A 3-D HF expert tensor cannot be split into per-expert 2-D views.
    #[error("{file}: tensor `{tensor}`: cannot split into per-expert views: {detail}")]
    ExpertSplit {
        /// The shard.
        file: PathBuf,
        /// The stored tensor name.
        tensor: String,
        /// Expected vs found.
        detail: String,
    },
    /// The requested canonical tensor is not in the checkpoint.
    #[error("tensor `{tensor}` not found in checkpoint {root} ({scheme} naming{hint})")]
    MissingTensor {
        /// The canonical name asked for.
        tensor: String,
        /// The checkpoint path.
        root: PathBuf,
        /// The detected naming scheme, as text.
        scheme: String,
        /// Optional extra hint (e.g. which stored names were tried).
        hint: String,
    },
    /// The stored (or logical) shape differs from the one the caller expects.
    #[error("{file}: tensor `{tensor}`: expected shape {expected:?}, found {found:?}{note}")]
    ShapeMismatch {
        /// The shard.
        file: PathBuf,
        /// The canonical name.
        tensor: String,
        /// Expected (logical) shape.
        expected: Vec<usize>,
        /// Found (logical) shape.
        found: Vec<usize>,
        /// Extra context: the stored name if it differs, FP4 packing ("stored [out, in/2]"), rank rules.
        note: String,
    },
    /// The stored dtype cannot be decoded the requested way (or a scale has a dtype spec §6 does not allow).
    #[error("{file}: tensor `{tensor}`{note}: expected dtype {expected}, found {found}")]
    DtypeMismatch {
        /// The shard.
        file: PathBuf,
        /// The canonical name.
        tensor: String,
        /// What would have been accepted.
        expected: String,
        /// The stored dtype.
        found: String,
        /// Extra context: the stored name if it differs from the canonical one.
        note: String,
    },
    /// An FP8/FP4 weight has no companion scale tensor (spec §2, §6).
    #[error(
        "{file}: tensor `{tensor}` is {format} but has no companion scale (looked for {tried:?})"
    )]
    MissingScale {
        /// The shard of the weight.
        file: PathBuf,
        /// The canonical weight name.
        tensor: String,
        /// The stored format of the weight.
        format: String,
        /// Canonical scale names looked for.
        tried: Vec<String>,
    },
    /// The companion scale has the wrong shape for the weight (spec §6: FP8 `[ceil(out/128),
    /// ceil(in/128)]`, FP4 `[out, in/32]`).
    #[error("{file}: scale `{scale}` of tensor `{tensor}`: expected scale shape {expected:?}, found {found:?} \
             (spec §6: FP8 [ceil(out/128), ceil(in/128)], FP4 [out, in/32])")]
    ScaleShape {
        /// The shard of the scale.
        file: PathBuf,
        /// The canonical weight name.
        tensor: String,
        /// The canonical scale name.
        scale: String,
        /// Expected scale shape, derived from the weight's shape.
        expected: Vec<usize>,
        /// Found scale shape.
        found: Vec<usize>,
    },
    /// The byte length of a tensor does not match dtype x shape.
    #[error("{file}: tensor `{tensor}`: expected {expected} bytes, found {found}")]
    ByteLength {
        /// The shard.
        file: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Expected byte count.
        expected: usize,
        /// Found byte count.
        found: usize,
    },
    /// A decoder in [`crate::quant`] rejected the data.
    #[error("{file}: tensor `{tensor}`: decode failed: {source}")]
    Quant {
        /// The shard.
        file: PathBuf,
        /// The canonical name.
        tensor: String,
        /// The decoder error.
        #[source]
        source: QuantError,
    },
    /// [`super::write_safetensors`] was given inconsistent input.
    #[error("{path}: cannot write tensor `{tensor}`: {detail}")]
    Write {
        /// The output file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Expected vs found.
        detail: String,
    },
}
