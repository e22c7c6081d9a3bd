//! The safetensors container: header parsing (with strict validation) and a writer.
//!
//! Layout: `u64` little-endian header length `n`, then `n` bytes of UTF-8 JSON
//! `{ name: { "dtype": "BF16", "shape": [..], "data_offsets": [begin, end] }, "__metadata__": {..}? }`,
//! then the data section; offsets are relative to the start of the data section.
//! Our own parser is used (instead of `safetensors::SafeTensors`) so that every error can name the
//! file, the tensor, and expected vs found, and so that unknown dtypes stay listable
//! ([`StoredDtype::Other`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::dtype::StoredDtype;
use super::error::CheckpointError;

/// One tensor entry of a parsed header, with absolute byte offsets into the file.
#[derive(Debug, Clone)]
pub(crate) struct RawTensor {
    pub name: String,
    pub dtype: StoredDtype,
    pub shape: Vec<usize>,
    /// Absolute offset of the first byte within the file.
    pub start: usize,
    /// Number of bytes.
    pub len: usize,
}

fn bad_header(file: &Path, detail: impl Into<String>) -> CheckpointError {
    CheckpointError::BadHeader {
        file: file.to_path_buf(),
        detail: detail.into(),
    }
}

fn bad_offsets(file: &Path, tensor: &str, detail: impl Into<String>) -> CheckpointError {
    CheckpointError::BadOffsets {
        file: file.to_path_buf(),
        tensor: tensor.to_string(),
        detail: detail.into(),
    }
}

fn as_usize(file: &Path, tensor: &str, what: &str, v: &Value) -> Result<usize, CheckpointError> {
    v.as_u64()
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| {
            bad_header(
                file,
                format!("tensor `{tensor}`: {what}: expected a non-negative integer, found {v}"),
            )
        })
}

/// Parses and validates the header of a whole safetensors file held in `bytes` (the mmap).
///
/// Errors: [`CheckpointError::Truncated`] (< 8 bytes), [`CheckpointError::HeaderTooLarge`],
/// [`CheckpointError::BadHeader`] (bad UTF-8/JSON/structure, overflowing shapes),
/// [`CheckpointError::BadOffsets`] (reversed, beyond the data section, or not dtype x shape bytes).
pub(crate) fn parse_header(file: &Path, bytes: &[u8]) -> Result<Vec<RawTensor>, CheckpointError> {
    let file_len = bytes.len() as u64;
    let Some(prefix) = bytes.get(..8) else {
        return Err(CheckpointError::Truncated {
            file: file.to_path_buf(),
            len: file_len,
        });
    };
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(prefix);
    let header_len = u64::from_le_bytes(len8);
    if header_len > file_len - 8 {
        return Err(CheckpointError::HeaderTooLarge {
            file: file.to_path_buf(),
            header_len,
            file_len,
        });
    }
    // header_len <= file_len, which came from a usize.
    let data_start = 8 + header_len as usize;
    let data_len = bytes.len() - data_start;
    let header = &bytes[8..data_start];
    let json: Value = serde_json::from_slice(header).map_err(|e| {
        bad_header(
            file,
            format!("JSON header of {header_len} bytes does not parse: {e}"),
        )
    })?;
    let Value::Object(map) = json else {
        return Err(bad_header(
            file,
            format!("expected a JSON object at top level, found {}", crate::json_kind(&json)),
        ));
    };
    let mut out = Vec::with_capacity(map.len());
    for (name, entry) in &map {
        if name == "__metadata__" {
            continue;
        }
        let Value::Object(entry) = entry else {
            return Err(bad_header(
                file,
                format!("tensor `{name}`: expected an object, found {}", crate::json_kind(entry)),
            ));
        };
        let dtype = match entry.get("dtype") {
            Some(Value::String(s)) => StoredDtype::from_header(s),
            other => {
                return Err(bad_header(
                    file,
                    format!(
                        "tensor `{name}`: expected string field \"dtype\", found {}",
                        other.map_or("nothing", crate::json_kind)
                    ),
                ))
            }
        };
        let shape = match entry.get("shape") {
            Some(Value::Array(dims)) => dims
                .iter()
                .map(|d| as_usize(file, name, "shape entry", d))
                .collect::<Result<Vec<_>, _>>()?,
            other => {
                return Err(bad_header(
                    file,
                    format!(
                        "tensor `{name}`: expected array field \"shape\", found {}",
                        other.map_or("nothing", crate::json_kind)
                    ),
                ))
            }
        };
        let (begin, end) = match entry.get("data_offsets") {
            Some(Value::Array(o)) if o.len() == 2 => (
                as_usize(file, name, "data_offsets[0]", &o[0])?,
                as_usize(file, name, "data_offsets[1]", &o[1])?,
            ),
            other => {
                return Err(bad_header(
                    file,
                    format!(
                        "tensor `{name}`: expected field \"data_offsets\" = [begin, end], found {}",
                        other.map_or_else(|| "nothing".to_string(), |v| v.to_string())
                    ),
                ))
            }
        };
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                bad_header(file, format!("tensor `{name}`: shape {shape:?} overflows"))
            })?;
        if begin > end {
            return Err(bad_offsets(
                file,
                name,
                format!("data_offsets [{begin}, {end}] are reversed"),
            ));
        }
        if end > data_len {
            return Err(bad_offsets(
                file,
                name,
                format!(
                    "data_offsets [{begin}, {end}] end beyond the data section of {data_len} bytes \
                     (file {file_len} bytes, header {header_len} bytes): file truncated or header corrupt"
                ),
            ));
        }
        if let Some(expected) = dtype.bytes_for(numel) {
            if end - begin != expected {
                return Err(bad_offsets(
                    file,
                    name,
                    format!(
                        "dtype {dtype} x shape {shape:?} needs {expected} bytes, data_offsets [{begin}, {end}] span {}",
                        end - begin
                    ),
                ));
            }
        } else if dtype.bits().is_some() {
            return Err(bad_offsets(
                file,
                name,
                format!("dtype {dtype} x shape {shape:?} is not a whole number of bytes"),
            ));
        }
        out.push(RawTensor {
            name: name.clone(),
            dtype,
            shape,
            start: data_start + begin,
            len: end - begin,
        });
    }
    Ok(out)
}


/// Writes tensors, already in their stored form, to one `.safetensors` file at `path`.
///
/// Each entry is `(name, dtype, shape, bytes)`; `bytes` must be exactly dtype x shape bytes
/// (little-endian, row-major; FP4 experts are `I8`/`U8` `[out, in/2]`, spec §6). Tensors are laid out
/// in the given order; the JSON header is padded with spaces to a multiple of 8 bytes, as the
/// safetensors format recommends, so the output is readable by the `safetensors` crate too.
///
/// Errors: [`CheckpointError::Write`] for a duplicate or reserved name (`__metadata__`), an unknown
/// dtype size, an overflowing shape, or a byte length that is not dtype x shape;
/// [`CheckpointError::Io`] if the file cannot be written.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, StoredDtype, Vec<usize>, Vec<u8>)],
) -> Result<(), CheckpointError> {
    let werr = |tensor: &str, detail: String| CheckpointError::Write {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        detail,
    };
    let mut header = Map::new();
    let mut offset = 0usize;
    for (name, dtype, shape, bytes) in tensors {
        if name == "__metadata__" {
            return Err(werr(
                name,
                "`__metadata__` is reserved by the safetensors format".into(),
            ));
        }
        if header.contains_key(name) {
            return Err(werr(name, "duplicate tensor name".into()));
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| werr(name, format!("shape {shape:?} overflows")))?;
        let expected = dtype.bytes_for(numel).ok_or_else(|| {
            werr(
                name,
                format!("dtype {dtype} with shape {shape:?} has no known whole-byte size"),
            )
        })?;
        if bytes.len() != expected {
            return Err(werr(
                name,
                format!(
                    "dtype {dtype} x shape {shape:?} needs {expected} bytes, found {}",
                    bytes.len()
                ),
            ));
        }
        let mut e = Map::new();
        e.insert(
            "dtype".into(),
            Value::String(dtype.header_name().to_string()),
        );
        e.insert(
            "shape".into(),
            Value::Array(shape.iter().map(|&d| Value::from(d as u64)).collect()),
        );
        e.insert(
            "data_offsets".into(),
            Value::Array(vec![
                Value::from(offset as u64),
                Value::from((offset + expected) as u64),
            ]),
        );
        header.insert(name.clone(), Value::Object(e));
        offset += expected;
    }
    let mut json = serde_json::to_string(&Value::Object(header))
        .map_err(|e| werr("", format!("header serialisation failed: {e}")))?;
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    let io = |source: std::io::Error| CheckpointError::Io {
        path: PathBuf::from(path),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut w = std::io::BufWriter::new(file);
    w.write_all(&(json.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(json.as_bytes()).map_err(io)?;
    for (_, _, _, bytes) in tensors {
        w.write_all(bytes).map_err(io)?;
    }
    w.flush().map_err(io)?;
    Ok(())
}
