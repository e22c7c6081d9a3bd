//! Stored element types of safetensors tensors (spec §2 "Dtype" column, §6 formats).

use std::fmt;

/// Element type of a tensor *as stored* in a safetensors file (spec §2, §6).
///
/// The names follow the safetensors header strings: `F32`, `F16`, `BF16`, `F8_E4M3` (FP8 weights),
/// `F8_E8M0` (ue8m0 block/group scales), `I8`/`U8` (packed FP4 e2m1 experts, two values per byte),
/// `I32`/`I64` (`tid2eid` hash-routing tables). Any other header string is kept verbatim in
/// [`StoredDtype::Other`]; such tensors can be listed and read as raw bytes but not decoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StoredDtype {
    /// IEEE binary32, little endian.
    F32,
    /// IEEE binary16, little endian.
    F16,
    /// bfloat16, little endian.
    BF16,
    /// FP8 e4m3 (OCP "fn" variant, max 448); spec §6.
    F8E4M3,
    /// Unsigned power-of-two scale byte, value 2^(e-127), 0xFF = NaN; spec §6.
    F8E8M0,
    /// Signed byte; packed FP4 experts in the official release (spec §2, §6).
    I8,
    /// Unsigned byte.
    U8,
    /// 32-bit signed integer, little endian (official `tid2eid`).
    I32,
    /// 64-bit signed integer, little endian (`tid2eid` as written by transformers, spec §2).
    I64,
    /// Any other safetensors dtype string, verbatim (e.g. `"F64"`, `"BOOL"`, `"F4"`).
    Other(String),
}

impl StoredDtype {
    /// Parses a safetensors header dtype string. Never fails: unknown strings become [`StoredDtype::Other`].
    pub fn from_header(s: &str) -> StoredDtype {
        match s {
            "F32" => StoredDtype::F32,
            "F16" => StoredDtype::F16,
            "BF16" => StoredDtype::BF16,
            "F8_E4M3" => StoredDtype::F8E4M3,
            "F8_E8M0" => StoredDtype::F8E8M0,
            "I8" => StoredDtype::I8,
            "U8" => StoredDtype::U8,
            "I32" => StoredDtype::I32,
            "I64" => StoredDtype::I64,
            other => StoredDtype::Other(other.to_string()),
        }
    }

    /// The safetensors header string for this dtype (inverse of [`StoredDtype::from_header`]).
    pub fn header_name(&self) -> &str {
        match self {
            StoredDtype::F32 => "F32",
            StoredDtype::F16 => "F16",
            StoredDtype::BF16 => "BF16",
            StoredDtype::F8E4M3 => "F8_E4M3",
            StoredDtype::F8E8M0 => "F8_E8M0",
            StoredDtype::I8 => "I8",
            StoredDtype::U8 => "U8",
            StoredDtype::I32 => "I32",
            StoredDtype::I64 => "I64",
            StoredDtype::Other(s) => s,
        }
    }

    /// Bits per element, or `None` for an [`StoredDtype::Other`] string this crate does not know.
    /// Covers every dtype of the safetensors 0.8 format, including sub-byte `F4`/`F6_*`.
    pub fn bits(&self) -> Option<usize> {
        Some(match self {
            StoredDtype::F8E4M3 | StoredDtype::F8E8M0 | StoredDtype::I8 | StoredDtype::U8 => 8,
            StoredDtype::F16 | StoredDtype::BF16 => 16,
            StoredDtype::F32 | StoredDtype::I32 => 32,
            StoredDtype::I64 => 64,
            StoredDtype::Other(s) => match s.as_str() {
                "F4" => 4,
                "F6_E2M3" | "F6_E3M2" => 6,
                "BOOL" | "F8_E5M2" | "F8_E4M3FNUZ" | "F8_E5M2FNUZ" => 8,
                "I16" | "U16" => 16,
                "U32" => 32,
                "F64" | "U64" | "C64" => 64,
                _ => return None,
            },
        })
    }

    /// Whole bytes per element, or `None` for sub-byte or unknown dtypes.
    pub fn byte_size(&self) -> Option<usize> {
        match self.bits()? {
            b if b % 8 == 0 => Some(b / 8),
            _ => None,
        }
    }

    /// Number of bytes a tensor of `numel` elements occupies, or `None` if unknown or overflowing.
    /// Sub-byte dtypes must fill whole bytes exactly (as the safetensors format requires).
    pub fn bytes_for(&self, numel: usize) -> Option<usize> {
        let bits = numel.checked_mul(self.bits()?)?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

impl fmt::Display for StoredDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.header_name())
    }
}
