//! Memory-mapped safetensors checkpoints, mapped to ONE canonical tensor table (spec §2, §6).
//!
//! - **Files** ([`Checkpoint::open`]): a single `.safetensors` file; a directory with
//!   `model.safetensors.index.json` (`weight_map`: tensor -> shard file; the official release ships
//!   `model-0000x-of-0000y.safetensors` with such an index); a directory with `model.safetensors`; or a
//!   directory with any set of `*.safetensors`. Every shard is memory-mapped (never copied) and the
//!   maps live as long as the [`Checkpoint`].
//! - **Names** ([`NamingScheme`], spec §2): official DeepSeek names, transformers `save_pretrained`
//!   names (`model.`-prefixed official names, spec §2 "Observed on disk"), or transformers module names
//!   (3-D routed experts split into per-expert 2-D views without copying). Canonical names are the
//!   official names without prefix, e.g. `layers.3.attn.wq_a.weight`, `layers.3.ffn.experts.7.w1.weight`;
//!   FP8/FP4 scale companions are canonically `<weight name without .weight>.scale`.
//! - **Formats** ([`Checkpoint::load_f32`], spec §6): F32/F16/BF16; FP8 e4m3 with 128x128 block scales
//!   (ue8m0 `F8_E8M0` or F32); FP4 e2m1 packed in I8/U8 `[out, in/2]` with ue8m0 scales `[out, in/32]`.
//!   Decoding is delegated to [`crate::quant`].

mod dtype;
mod error;
mod format;
mod naming;
pub mod official;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use dtype::StoredDtype;
pub use error::CheckpointError;
pub use format::write_safetensors;
pub use naming::NamingScheme;

use crate::quant;
use format::RawTensor;
use naming::{ExpertKind, Mapped};

/// FP8 block size (rows and columns) of the official weight scales (spec §6).
pub const FP8_BLOCK: usize = 128;
/// FP4 group size along the input dimension of the routed-expert scales (spec §6).
pub const FP4_GROUP: usize = 32;

/// Where a canonical tensor lives on disk.
///
/// For the per-expert views of a 3-D HF module tensor (spec §2, `mlp.experts.gate_up_proj` /
/// `down_proj`), `shape` is the 2-D view shape (`[I, D]` for w1/w3, `[D, I]` for w2) and
/// `stored_name` is the 3-D tensor's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Stored element type.
    pub dtype: StoredDtype,
    /// Stored shape (bytes-level: FP4 experts are `[out, in/2]`).
    pub shape: Vec<usize>,
    /// The shard file holding it.
    pub file: PathBuf,
    /// The name in that file's header.
    pub stored_name: String,
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

#[derive(Debug, Clone)]
struct Entry {
    shard: usize,
    stored_name: String,
    dtype: StoredDtype,
    shape: Vec<usize>,
    /// Absolute byte offset in the shard's mmap.
    start: usize,
    len: usize,
}

/// An opened checkpoint: memory-mapped shards plus the canonical tensor table (spec §2).
///
/// Cheap to query; all tensor bytes are borrowed from the mmaps ([`Checkpoint::raw_bytes`]) until
/// decoded ([`Checkpoint::load_f32`], [`Checkpoint::load_i64`]).
pub struct Checkpoint {
    root: PathBuf,
    scheme: NamingScheme,
    shards: Vec<Shard>,
    table: BTreeMap<String, Entry>,
    total_bytes: u64,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("root", &self.root)
            .field("scheme", &self.scheme)
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.table.len())
            .field("total_bytes", &self.total_bytes)
            .finish()
    }
}

/// The files making up a checkpoint.
enum Layout {
    Files(Vec<PathBuf>),
    Index(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn resolve(path: &Path) -> Result<Layout, CheckpointError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CheckpointError::NotFound {
                path: path.to_path_buf(),
                detail: "expected a .safetensors file, an index .json, or a directory".into(),
            })
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    if meta.is_file() {
        let is_json = path.extension().is_some_and(|e| e == "json");
        return Ok(if is_json {
            Layout::Index(path.to_path_buf())
        } else {
            Layout::Files(vec![path.to_path_buf()])
        });
    }
    let index = path.join("model.safetensors.index.json");
    if index.is_file() {
        return Ok(Layout::Index(index));
    }
    let single = path.join("model.safetensors");
    if single.is_file() {
        return Ok(Layout::Files(vec![single]));
    }
    let mut indexes = Vec::new();
    let mut files = Vec::new();
    for ent in std::fs::read_dir(path).map_err(io_err(path))? {
        let p = ent.map_err(io_err(path))?.path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !p.is_file() {
            continue;
        }
        if name.ends_with(".safetensors.index.json") {
            indexes.push(p);
        } else if name.ends_with(".safetensors") {
            files.push(p);
        }
    }
    indexes.sort();
    files.sort();
    match indexes.len() {
        0 => {}
        1 => return Ok(Layout::Index(indexes.remove(0))),
        _ => {
            return Err(CheckpointError::BadIndex {
                index: indexes[0].clone(),
                detail: format!(
                    "expected one *.safetensors.index.json in {}, found {indexes:?}",
                    path.display()
                ),
            })
        }
    }
    if files.is_empty() {
        return Err(CheckpointError::NotFound {
            path: path.to_path_buf(),
            detail: "directory holds no model.safetensors.index.json, no model.safetensors and no *.safetensors".into(),
        });
    }
    Ok(Layout::Files(files))
}

/// Reads `weight_map` of a safetensors index: (tensor, shard path) in index order.
fn read_index(index: &Path) -> Result<Vec<(String, PathBuf)>, CheckpointError> {
    let bad = |detail: String| CheckpointError::BadIndex {
        index: index.to_path_buf(),
        detail,
    };
    let text = std::fs::read(index).map_err(io_err(index))?;
    let json: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(format!("JSON does not parse: {e}")))?;
    let Some(map) = json.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(bad(
            "expected an object field \"weight_map\" (tensor -> shard file)".into(),
        ));
    };
    let dir = index.parent().unwrap_or(Path::new("."));
    map.iter()
        .map(|(t, f)| match f.as_str() {
            Some(f) => Ok((t.clone(), dir.join(f))),
            None => Err(bad(format!(
                "weight_map[`{t}`]: expected a shard file name (string), found {f}"
            ))),
        })
        .collect()
}

fn map_shard(path: &Path) -> Result<(Mmap, Vec<RawTensor>), CheckpointError> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    if len < 8 {
        return Err(CheckpointError::Truncated {
            file: path.to_path_buf(),
            len,
        });
    }
    // SAFETY: the map is read-only. Like every mmap-based loader, we rely on the checkpoint file not
    // being truncated or rewritten by another process while the Checkpoint is alive.
    let mmap = unsafe { Mmap::map(&file) }.map_err(io_err(path))?;
    let tensors = format::parse_header(path, &mmap)?;
    Ok((mmap, tensors))
}

/// `" (stored as `x`)"` when the stored name differs from the canonical one, else empty.
fn stored_note(canonical: &str, e: &Entry) -> String {
    if e.stored_name == canonical {
        String::new()
    } else {
        format!(" (stored as `{}`)", e.stored_name)
    }
}

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

impl Checkpoint {
    /// Opens a checkpoint: a `.safetensors` file, a `*.safetensors.index.json`, or a directory
    /// (index preferred, then `model.safetensors`, then any `*.safetensors`). Memory-maps every shard,
    /// validates every header, detects the naming scheme and builds the canonical table (spec §2).
    ///
    /// Errors: [`CheckpointError::NotFound`], [`CheckpointError::Io`], [`CheckpointError::Truncated`],
    /// [`CheckpointError::HeaderTooLarge`], [`CheckpointError::BadHeader`], [`CheckpointError::BadOffsets`],
    /// [`CheckpointError::BadIndex`], [`CheckpointError::MissingShard`],
    /// [`CheckpointError::IndexTensorMissing`], [`CheckpointError::DuplicateTensor`] (a stored name in
    /// two shards, or two stored names with one canonical name), [`CheckpointError::Scheme`] (mixed
    /// schemes or no recognizable names), [`CheckpointError::ExpertSplit`].
    ///
    /// With an index, every `weight_map` entry must be present in its shard; tensors a shard holds
    /// beyond its `weight_map` entries are loaded too (a stored name may still appear only once).
    pub fn open(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let layout = resolve(path)?;
        let (files, index) = match layout {
            Layout::Files(f) => (f, None),
            Layout::Index(index) => {
                let map = read_index(&index)?;
                let mut files: Vec<PathBuf> = Vec::new();
                for (tensor, shard) in &map {
                    if !files.contains(shard) {
                        if !shard.is_file() {
                            return Err(CheckpointError::MissingShard {
                                index: index.clone(),
                                shard: shard.clone(),
                                tensor: tensor.clone(),
                            });
                        }
                        files.push(shard.clone());
                    }
                }
                files.sort();
                (files, Some((index, map)))
            }
        };

        let mut shards = Vec::with_capacity(files.len());
        let mut stored: Vec<(usize, RawTensor)> = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, path) in files.into_iter().enumerate() {
            let (mmap, tensors) = map_shard(&path)?;
            for t in tensors {
                if let Some(&j) = seen.get(&t.name) {
                    let first: &Shard = &shards[j];
                    return Err(CheckpointError::DuplicateTensor {
                        tensor: t.name.clone(),
                        first_name: t.name.clone(),
                        first: first.path.clone(),
                        second_name: t.name.clone(),
                        second: path.clone(),
                    });
                }
                seen.insert(t.name.clone(), i);
                stored.push((i, t));
            }
            shards.push(Shard { path, mmap });
        }
        if let Some((index, map)) = &index {
            for (tensor, shard) in map {
                let present = seen.get(tensor).is_some_and(|&i| &shards[i].path == shard);
                if !present {
                    return Err(CheckpointError::IndexTensorMissing {
                        index: index.clone(),
                        shard: shard.clone(),
                        tensor: tensor.clone(),
                    });
                }
            }
        }
        stored.sort_by(|a, b| a.1.name.cmp(&b.1.name));

        let names: Vec<(&str, &Path)> = stored
            .iter()
            .map(|(i, t)| (t.name.as_str(), shards[*i].path.as_path()))
            .collect();
        let scheme = naming::detect(path, &names)?;

        let mut table: BTreeMap<String, Entry> = BTreeMap::new();
        let mut total_bytes = 0u64;
        for (shard, t) in stored {
            total_bytes += t.len as u64;
            let mapped = naming::recognize(scheme, &t.name)
                .unwrap_or_else(|| Mapped::Direct(naming::fallback(scheme, &t.name)));
            let entries = match mapped {
                Mapped::Direct(c) => vec![(
                    c,
                    Entry {
                        shard,
                        stored_name: t.name,
                        dtype: t.dtype,
                        shape: t.shape,
                        start: t.start,
                        len: t.len,
                    },
                )],
                Mapped::Experts { layer, kind } => {
                    split_experts(&shards[shard].path, shard, &layer, kind, t)?
                }
            };
            for (c, e) in entries {
                if let Some(prev) = table.get(&c) {
                    return Err(CheckpointError::DuplicateTensor {
                        tensor: c,
                        first_name: prev.stored_name.clone(),
                        first: shards[prev.shard].path.clone(),
                        second_name: e.stored_name,
                        second: shards[e.shard].path.clone(),
                    });
                }
                table.insert(c, e);
            }
        }
        Ok(Checkpoint {
            root: path.to_path_buf(),
            scheme,
            shards,
            table,
            total_bytes,
        })
    }

    /// The detected naming scheme (spec §2).
    pub fn scheme(&self) -> NamingScheme {
        self.scheme
    }

    /// The path given to [`Checkpoint::open`].
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The memory-mapped shard files, sorted.
    pub fn files(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|s| s.path.clone()).collect()
    }

    /// All canonical tensor names (weights, scale companions, tables, `mtp.*`), sorted.
    pub fn names(&self) -> Vec<String> {
        self.table.keys().cloned().collect()
    }

    /// Whether a canonical tensor exists.
    pub fn contains(&self, canonical: &str) -> bool {
        self.table.contains_key(canonical)
    }

    /// Stored dtype, stored shape, file and stored name of a canonical tensor; `None` if absent.
    /// For per-expert views of 3-D HF tensors the shape is the 2-D view shape.
    pub fn info(&self, canonical: &str) -> Option<TensorInfo> {
        let e = self.table.get(canonical)?;
        Some(TensorInfo {
            dtype: e.dtype.clone(),
            shape: e.shape.clone(),
            file: self.shards[e.shard].path.clone(),
            stored_name: e.stored_name.clone(),
        })
    }

    /// The stored bytes of a canonical tensor (or expert view), borrowed from the mmap.
    ///
    /// Errors: [`CheckpointError::MissingTensor`].
    pub fn raw_bytes(&self, canonical: &str) -> Result<&[u8], CheckpointError> {
        let e = self.entry(canonical)?;
        self.bytes_of(canonical, e)
    }

    /// Sum of the byte sizes of all stored tensors (headers excluded).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    fn entry(&self, canonical: &str) -> Result<&Entry, CheckpointError> {
        self.table.get(canonical).ok_or_else(|| {
            let hint = match naming::recognize(NamingScheme::HfModule, canonical)
                .or_else(|| naming::recognize(NamingScheme::HfSaved, canonical))
            {
                Some(Mapped::Direct(c)) if c != canonical => {
                    format!("; expected a canonical name such as `{c}`")
                }
                _ => String::new(),
            };
            CheckpointError::MissingTensor {
                tensor: canonical.to_string(),
                root: self.root.clone(),
                scheme: format!("{}", self.scheme),
                hint,
            }
        })
    }

    fn bytes_of(&self, canonical: &str, e: &Entry) -> Result<&[u8], CheckpointError> {
        let shard = &self.shards[e.shard];
        shard
            .mmap
            .get(e.start..e.start + e.len)
            .ok_or_else(|| CheckpointError::ByteLength {
                file: shard.path.clone(),
                tensor: canonical.to_string(),
                expected: e.len,
                found: shard.mmap.len().saturating_sub(e.start),
            })
    }

    /// The companion scale of a weight: canonical `<name without .weight>.scale`, else
    /// `<name>_scale_inv` (only reachable for pass-through `mtp.*` names). Spec §2, §6.
    fn scale_of(&self, canonical: &str) -> (Vec<String>, Option<(String, &Entry)>) {
        let base = canonical.strip_suffix(".weight").unwrap_or(canonical);
        let tried = vec![format!("{base}.scale"), format!("{canonical}_scale_inv")];
        let found = tried
            .iter()
            .find_map(|n| self.table.get(n).map(|e| (n.clone(), e)));
        (tried, found)
    }

    /// Human-readable stored format of a canonical tensor, for reports: `"f32"`, `"f16"`, `"bf16"`,
    /// `"i32"`, `"i64"`, `"ue8m0"`, `"fp8-e4m3 (ue8m0 128x128)"`, `"fp8-e4m3 (f32 128x128)"`,
    /// `"fp8-e4m3 (no scale)"`, `"fp4-e2m1 (ue8m0 /32)"`, `"i8"`/`"u8"` (no scale), or the lower-cased
    /// safetensors dtype for others. `None` if the tensor is absent. Spec §6.
    pub fn format_of(&self, canonical: &str) -> Option<String> {
        let e = self.table.get(canonical)?;
        let scale = || self.scale_of(canonical).1.map(|(_, s)| s.dtype.clone());
        Some(match &e.dtype {
            StoredDtype::F32 => "f32".into(),
            StoredDtype::F16 => "f16".into(),
            StoredDtype::BF16 => "bf16".into(),
            StoredDtype::I32 => "i32".into(),
            StoredDtype::I64 => "i64".into(),
            StoredDtype::F8E8M0 => "ue8m0".into(),
            StoredDtype::F8E4M3 => match scale() {
                Some(StoredDtype::F8E8M0 | StoredDtype::U8) => "fp8-e4m3 (ue8m0 128x128)".into(),
                Some(StoredDtype::F32) => "fp8-e4m3 (f32 128x128)".into(),
                Some(d) => format!("fp8-e4m3 ({} scale)", d.header_name().to_lowercase()),
                None => "fp8-e4m3 (no scale)".into(),
            },
            d @ (StoredDtype::I8 | StoredDtype::U8) => match scale() {
                Some(StoredDtype::F8E8M0 | StoredDtype::U8) => "fp4-e2m1 (ue8m0 /32)".into(),
                Some(s) => format!("fp4-e2m1 ({} scale)", s.header_name().to_lowercase()),
                None => d.header_name().to_lowercase(),
            },
            StoredDtype::Other(s) => s.to_lowercase(),
        })
    }

    fn shape_err(
        &self,
        canonical: &str,
        e: &Entry,
        expected: &[usize],
        found: Vec<usize>,
        note: String,
    ) -> CheckpointError {
        let stored = stored_note(canonical, e);
        CheckpointError::ShapeMismatch {
            file: self.shards[e.shard].path.clone(),
            tensor: canonical.to_string(),
            expected: expected.to_vec(),
            found,
            note: format!("{note}{stored}"),
        }
    }

    fn dtype_err(&self, canonical: &str, e: &Entry, expected: &str) -> CheckpointError {
        CheckpointError::DtypeMismatch {
            file: self.shards[e.shard].path.clone(),
            tensor: canonical.to_string(),
            expected: expected.to_string(),
            found: e.dtype.to_string(),
            note: stored_note(canonical, e),
        }
    }

    /// Loads a canonical tensor as f32 with the `expected` logical shape (`[out, in]` for weights, any
    /// rank for plain tensors). Spec §6:
    /// - `F32`, `F16`, `BF16`, `F8_E8M0` (as 2^(e-127)): decoded directly; stored shape must equal `expected`.
    /// - `F8_E4M3`: needs the companion scale (`F8_E8M0` ue8m0 or `F32`) of shape
    ///   `[ceil(out/128), ceil(in/128)]`; `W[o,i] = e4m3(W_q[o,i]) * S[o/128, i/128]`.
    /// - `I8`/`U8` with a companion scale: FP4 e2m1 stored `[out, in/2]` (low nibble = even element),
    ///   ue8m0 scale `[out, ceil(in/32)]`; logical shape `[out, in]`.
    ///
    /// Errors (each naming tensor and file): [`CheckpointError::MissingTensor`],
    /// [`CheckpointError::ShapeMismatch`], [`CheckpointError::DtypeMismatch`] (unsupported dtype, or
    /// wrong scale dtype), [`CheckpointError::MissingScale`], [`CheckpointError::ScaleShape`],
    /// [`CheckpointError::ByteLength`], [`CheckpointError::Quant`].
    pub fn load_f32(
        &self,
        canonical: &str,
        expected: &[usize],
    ) -> Result<Vec<f32>, CheckpointError> {
        let e = self.entry(canonical)?;
        let bytes = self.bytes_of(canonical, e)?;
        let plain = |f: fn(&[u8]) -> f32, width: usize| -> Result<Vec<f32>, CheckpointError> {
            if e.shape != expected {
                return Err(self.shape_err(canonical, e, expected, e.shape.clone(), String::new()));
            }
            self.check_len(canonical, e, bytes)?;
            Ok(bytes.chunks_exact(width).map(f).collect())
        };
        match &e.dtype {
            StoredDtype::F32 => plain(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]), 4),
            StoredDtype::F16 => plain(|c| quant::f16_to_f32(u16::from_le_bytes([c[0], c[1]])), 2),
            StoredDtype::BF16 => plain(|c| quant::bf16_to_f32(u16::from_le_bytes([c[0], c[1]])), 2),
            StoredDtype::F8E8M0 => plain(|c| quant::ue8m0_to_f32(c[0]), 1),
            StoredDtype::F8E4M3 => self.load_fp8(canonical, e, bytes, expected),
            StoredDtype::I8 | StoredDtype::U8 => self.load_fp4(canonical, e, bytes, expected),
            _ => Err(self.dtype_err(
                canonical,
                e,
                "F32, F16, BF16, F8_E8M0, F8_E4M3 (+scale) or I8/U8 FP4 (+scale) for load_f32 (spec §6)",
            )),
        }
    }

    fn check_len(&self, canonical: &str, e: &Entry, bytes: &[u8]) -> Result<(), CheckpointError> {
        let numel: usize = e.shape.iter().product();
        let expected = e.dtype.bytes_for(numel).unwrap_or(usize::MAX);
        if bytes.len() != expected {
            return Err(CheckpointError::ByteLength {
                file: self.shards[e.shard].path.clone(),
                tensor: canonical.to_string(),
                expected,
                found: bytes.len(),
            });
        }
        Ok(())
    }

    fn load_fp8(
        &self,
        canonical: &str,
        e: &Entry,
        bytes: &[u8],
        expected: &[usize],
    ) -> Result<Vec<f32>, CheckpointError> {
        if e.shape != expected {
            return Err(self.shape_err(canonical, e, expected, e.shape.clone(), String::new()));
        }
        let &[rows, cols] = e.shape.as_slice() else {
            return Err(self.shape_err(
                canonical,
                e,
                expected,
                e.shape.clone(),
                "; FP8 block-scaled weights must be 2-D [out, in] (spec §6)".into(),
            ));
        };
        self.check_len(canonical, e, bytes)?;
        let (tried, scale) = self.scale_of(canonical);
        let Some((sname, s)) = scale else {
            return Err(CheckpointError::MissingScale {
                file: self.shards[e.shard].path.clone(),
                tensor: canonical.to_string(),
                format: "FP8 e4m3 (needs 128x128 block scales, spec §6)".into(),
                tried,
            });
        };
        let want = vec![ceil_div(rows, FP8_BLOCK), ceil_div(cols, FP8_BLOCK)];
        if s.shape != want {
            return Err(CheckpointError::ScaleShape {
                file: self.shards[s.shard].path.clone(),
                tensor: canonical.to_string(),
                scale: sname,
                expected: want,
                found: s.shape.clone(),
            });
        }
        let sbytes = self.bytes_of(&sname, s)?;
        self.check_len(&sname, s, sbytes)?;
        let quant_err = |source| CheckpointError::Quant {
            file: self.shards[e.shard].path.clone(),
            tensor: canonical.to_string(),
            source,
        };
        match s.dtype {
            StoredDtype::F8E8M0 | StoredDtype::U8 => quant::dequant_fp8_blocked(
                bytes,
                rows,
                cols,
                quant::BlockScales::Ue8m0(sbytes),
                FP8_BLOCK,
            )
            .map_err(quant_err),
            StoredDtype::F32 => {
                let sf: Vec<f32> = sbytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                quant::dequant_fp8_blocked(
                    bytes,
                    rows,
                    cols,
                    quant::BlockScales::F32(&sf),
                    FP8_BLOCK,
                )
                .map_err(quant_err)
            }
            _ => Err(self.dtype_err(
                &sname,
                s,
                "F8_E8M0 (ue8m0) or F32 for an FP8 block scale (spec §6)",
            )),
        }
    }

    fn load_fp4(
        &self,
        canonical: &str,
        e: &Entry,
        bytes: &[u8],
        expected: &[usize],
    ) -> Result<Vec<f32>, CheckpointError> {
        let (tried, scale) = self.scale_of(canonical);
        let Some((sname, s)) = scale else {
            return Err(CheckpointError::MissingScale {
                file: self.shards[e.shard].path.clone(),
                tensor: canonical.to_string(),
                format: format!(
                    "{} (FP4 e2m1 packed; needs ue8m0 group-32 scales, spec §6)",
                    e.dtype
                ),
                tried,
            });
        };
        let &[rows, half] = e.shape.as_slice() else {
            return Err(self.shape_err(
                canonical,
                e,
                expected,
                e.shape.clone(),
                "; FP4 weights must be stored 2-D [out, in/2] (spec §6)".into(),
            ));
        };
        let cols = half * 2;
        if expected != [rows, cols] {
            return Err(self.shape_err(
                canonical,
                e,
                expected,
                vec![rows, cols],
                format!(
                    " (logical; stored FP4 packed as [out, in/2] = {:?}, spec §6)",
                    e.shape
                ),
            ));
        }
        self.check_len(canonical, e, bytes)?;
        let want = vec![rows, ceil_div(cols, FP4_GROUP)];
        if s.shape != want {
            return Err(CheckpointError::ScaleShape {
                file: self.shards[s.shard].path.clone(),
                tensor: canonical.to_string(),
                scale: sname,
                expected: want,
                found: s.shape.clone(),
            });
        }
        if !matches!(s.dtype, StoredDtype::F8E8M0 | StoredDtype::U8) {
            return Err(self.dtype_err(
                &sname,
                s,
                "F8_E8M0 (ue8m0) for an FP4 group scale (spec §6)",
            ));
        }
        let sbytes = self.bytes_of(&sname, s)?;
        self.check_len(&sname, s, sbytes)?;
        quant::dequant_fp4_grouped(bytes, rows, cols, sbytes, FP4_GROUP).map_err(|source| {
            CheckpointError::Quant {
                file: self.shards[e.shard].path.clone(),
                tensor: canonical.to_string(),
                source,
            }
        })
    }

    /// Loads an integer table (e.g. `layers.{L}.ffn.gate.tid2eid`, [vocab, top-k]: I32 in the official
    /// release, I64 as written by transformers; spec §2) as i64. The stored shape must equal `expected`.
    ///
    /// Errors: [`CheckpointError::MissingTensor`], [`CheckpointError::ShapeMismatch`],
    /// [`CheckpointError::DtypeMismatch`] (anything but I32/I64), [`CheckpointError::ByteLength`].
    pub fn load_i64(
        &self,
        canonical: &str,
        expected: &[usize],
    ) -> Result<Vec<i64>, CheckpointError> {
        let e = self.entry(canonical)?;
        let bytes = self.bytes_of(canonical, e)?;
        let (conv, width): (fn(&[u8]) -> i64, usize) = match e.dtype {
            StoredDtype::I32 => (
                |c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                4,
            ),
            StoredDtype::I64 => (
                |c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                8,
            ),
            _ => return Err(self.dtype_err(canonical, e, "I32 or I64 (integer table, spec §2)")),
        };
        if e.shape != expected {
            return Err(self.shape_err(canonical, e, expected, e.shape.clone(), String::new()));
        }
        self.check_len(canonical, e, bytes)?;
        Ok(bytes.chunks_exact(width).map(conv).collect())
    }
}

/// Splits a 3-D HF routed-expert tensor into per-expert 2-D canonical views (spec §2):
/// `gate_up_proj` [E, 2I, D] -> `experts.{e}.w1` rows `0..I` and `w3` rows `I..2I` of expert `e`;
/// `down_proj` [E, D, I] -> `experts.{e}.w2`. Scale companions split the same way (`.scale`). Every
/// view is a contiguous byte range of the stored tensor.
fn split_experts(
    file: &Path,
    shard: usize,
    layer: &str,
    kind: ExpertKind,
    t: RawTensor,
) -> Result<Vec<(String, Entry)>, CheckpointError> {
    let err = |detail: String| CheckpointError::ExpertSplit {
        file: file.to_path_buf(),
        tensor: t.name.clone(),
        detail,
    };
    let &[experts, rows, cols] = t.shape.as_slice() else {
        return Err(err(format!(
            "expected a 3-D tensor [experts, out, in], found shape {:?}",
            t.shape
        )));
    };
    let Some(elem) = t.dtype.byte_size() else {
        return Err(err(format!(
            "dtype {} has no whole-byte element size",
            t.dtype
        )));
    };
    let row_bytes = cols * elem;
    let (parts, suffix): (&[&str], &str) = match kind {
        ExpertKind::GateUp => (&["w1", "w3"], "weight"),
        ExpertKind::GateUpScale => (&["w1", "w3"], "scale"),
        ExpertKind::Down => (&["w2"], "weight"),
        ExpertKind::DownScale => (&["w2"], "scale"),
    };
    if rows % parts.len() != 0 {
        return Err(err(format!(
            "gate_up dimension 1 must be even (concat of w1 and w3, 2I rows), found shape {:?}",
            t.shape
        )));
    }
    let part_rows = rows / parts.len();
    let mut out = Vec::with_capacity(experts * parts.len());
    for e in 0..experts {
        for (k, w) in parts.iter().enumerate() {
            let row0 = e * rows + k * part_rows;
            out.push((
                format!("layers.{layer}.ffn.experts.{e}.{w}.{suffix}"),
                Entry {
                    shard,
                    stored_name: t.name.clone(),
                    dtype: t.dtype.clone(),
                    shape: vec![part_rows, cols],
                    start: t.start + row0 * row_bytes,
                    len: part_rows * row_bytes,
                },
            ));
        }
    }
    Ok(out)
}
