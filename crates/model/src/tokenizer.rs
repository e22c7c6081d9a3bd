//! The DeepSeek-V4 tokenizer: a byte-level BPE (128,000 merges-vocabulary entries plus 1,283
//! added tokens, ids `0..129280`) loaded with Hugging Face `tokenizers`.
//!
//! The V4 `tokenizer.json` ships inside the binary (gzip-compressed, ~1.9 MB; see
//! `crates/model/assets/TOKENIZER_LICENSE.md` for its source and MIT notice) and is decompressed
//! when a tokenizer is built: [`Ds4Tokenizer::embedded`] builds a fresh one,
//! [`Ds4Tokenizer::shared`] builds one per process and hands out `&'static` references.
//!
//! Two encoders, on purpose:
//!
//! - [`Ds4Tokenizer::encode_with_special`] is exactly `tokenizer.encode(text, add_special_tokens=False)`
//!   of the reference implementation: every added token (`<｜User｜>`, `<think>`, `｜DSML｜`, BOS/EOS,
//!   …) written in `text` becomes its single id. Use it for prompts *rendered by the chat encoder*.
//! - [`Ds4Tokenizer::encode_text`] treats the whole input as plain text: an added token typed by a
//!   user is split into ordinary BPE pieces and can never turn into a control id. Use it for
//!   anything that came from a user.
//!
//! Decoding follows the reference (`decode(ids, skip_special_tokens)`), and [`StreamDecoder`]
//! yields the same text incrementally, holding back incomplete UTF-8 sequences.
//!
//! The regex engine behind the pre-tokenizer is `fancy-regex` (pure Rust, built on the `regex`
//! crate) rather than the crate's default Oniguruma C library; the fixture tests in this module
//! check that it reproduces the reference ids exactly.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tokenizers::{
    DecoderWrapper, Model, Normalizer, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer,
};

/// `tokenizer.json` of the DeepSeek-V4 series (Flash and Pro share it), `gzip -9 -n` compressed.
static EMBEDDED_TOKENIZER_GZ: &[u8] = include_bytes!("../assets/tokenizer.json.gz");

/// Content of the beginning-of-sequence token (id 0 in V4).
pub const BOS_TOKEN: &str = "<｜begin▁of▁sentence｜>";
/// Content of the end-of-sequence token (id 1 in V4; also the padding token of the reference config).
pub const EOS_TOKEN: &str = "<｜end▁of▁sentence｜>";

/// Everything that can go wrong while loading a tokenizer, encoding or decoding.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// Reading a `tokenizer.json` from disk failed.
    #[error("cannot read tokenizer file {path}: {source}")]
    Io {
        /// The file that was read.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The tokenizer embedded in the binary could not be decompressed (a corrupt build).
    #[error("cannot decompress the embedded tokenizer: {0}")]
    Decompress(#[source] std::io::Error),
    /// The bytes are not a valid `tokenizer.json` for the `tokenizers` library.
    #[error("invalid tokenizer.json: {0}")]
    Parse(#[source] tokenizers::Error),
    /// The `tokenizer.json` is valid but not of the DeepSeek-V4 kind this module handles
    /// (byte-level BPE with BOS/EOS tokens).
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    /// Encoding failed inside the tokenizer pipeline.
    #[error("encoding failed: {0}")]
    Encode(#[source] tokenizers::Error),
    /// Decoding failed inside the tokenizer pipeline.
    #[error("decoding failed: {0}")]
    Decode(#[source] tokenizers::Error),
    /// Building the embedded tokenizer failed (for [`Ds4Tokenizer::shared`], which caches the
    /// outcome; the message is that of the original error).
    #[error("embedded tokenizer unavailable: {0}")]
    Embedded(String),
    /// A token id that is not part of the vocabulary.
    #[error("token id {id} is not in the vocabulary (size {vocab_size})")]
    UnknownId {
        /// The offending id.
        id: u32,
        /// The tokenizer's [`Ds4Tokenizer::vocab_size`].
        vocab_size: usize,
    },
}

/// The DeepSeek-V4 tokenizer (or one loaded from a compatible `tokenizer.json`).
///
/// Cheap to share by reference across threads (`Send + Sync`); building one takes a few hundred
/// milliseconds, so keep one per process (see [`Ds4Tokenizer::shared`]).
#[derive(Clone)]
pub struct Ds4Tokenizer {
    inner: Tokenizer,
    vocab_size: usize,
    bos: u32,
    eos: u32,
    /// `special[id]`: the id is an added token flagged `special`, i.e. dropped by
    /// `decode(.., skip_special = true)`.
    special: Vec<bool>,
}

impl fmt::Debug for Ds4Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ds4Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field(
                "special_tokens",
                &self.special.iter().filter(|s| **s).count(),
            )
            .finish_non_exhaustive()
    }
}

impl Ds4Tokenizer {
    /// The DeepSeek-V4 tokenizer shipped inside this binary (decompressed and parsed on every
    /// call; prefer [`Ds4Tokenizer::shared`] unless an owned instance is needed).
    pub fn embedded() -> Result<Self, TokenizerError> {
        let mut json = Vec::with_capacity(6_400_000);
        flate2::read::GzDecoder::new(EMBEDDED_TOKENIZER_GZ)
            .read_to_end(&mut json)
            .map_err(TokenizerError::Decompress)?;
        Self::from_bytes(&json)
    }

    /// The embedded tokenizer, built once per process on first use and shared afterwards.
    pub fn shared() -> Result<&'static Self, TokenizerError> {
        static SHARED: OnceLock<Result<Ds4Tokenizer, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| Self::embedded().map_err(|e| e.to_string()))
            .as_ref()
            // The embedded data is fixed at build time, so a failure here is permanent; the
            // original error is kept as its message.
            .map_err(|msg| TokenizerError::Embedded(msg.clone()))
    }

    /// Load a `tokenizer.json` from disk (e.g. the one next to a checkpoint).
    ///
    /// The file must describe a byte-level BPE tokenizer containing [`BOS_TOKEN`] and
    /// [`EOS_TOKEN`], as every DeepSeek-V4 checkpoint's does.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let json = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&json)
    }

    /// Load a tokenizer from the bytes of a `tokenizer.json` (same requirements as
    /// [`Ds4Tokenizer::from_file`]).
    pub fn from_bytes(json: &[u8]) -> Result<Self, TokenizerError> {
        let mut inner = Tokenizer::from_bytes(json).map_err(TokenizerError::Parse)?;
        // Ids must not depend on truncation/padding settings stored in the file.
        inner
            .with_truncation(None)
            .map_err(TokenizerError::Parse)?
            .with_padding(None);

        match inner.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => {}
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "decoder must be ByteLevel, found {other:?}"
                )))
            }
        }

        let vocab = inner.get_vocab(true);
        let vocab_size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        let bos = inner
            .token_to_id(BOS_TOKEN)
            .ok_or_else(|| TokenizerError::Unsupported(format!("no BOS token {BOS_TOKEN:?}")))?;
        let eos = inner
            .token_to_id(EOS_TOKEN)
            .ok_or_else(|| TokenizerError::Unsupported(format!("no EOS token {EOS_TOKEN:?}")))?;

        let mut special = vec![false; vocab_size];
        for (id, added) in inner.get_added_tokens_decoder() {
            if added.special {
                if let Some(flag) = special.get_mut(id as usize) {
                    *flag = true;
                }
            }
        }

        Ok(Self {
            inner,
            vocab_size,
            bos,
            eos,
            special,
        })
    }

    /// Encode raw user text. Added/special tokens written literally in `text` are **not** turned
    /// into their ids: the whole string goes through the normal pre-tokenizer and BPE, so e.g. a
    /// user typing `<｜User｜>` gets ordinary pieces (`<`, `｜`, `User`, …) that decode back to
    /// the same text. Special tokens are never produced from user text unless the caller asks
    /// (with [`Ds4Tokenizer::encode_with_special`] or by inserting ids itself).
    ///
    /// No BOS/EOS is added.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        // The pipeline of `TokenizerImpl::encode(text, false)` minus the added-vocabulary split:
        // normalize -> pre-tokenize -> model, on the whole string.
        let mut pre = PreTokenizedString::from(text);
        if let Some(normalizer) = self.inner.get_normalizer() {
            pre.normalize(|s| normalizer.normalize(s))
                .map_err(TokenizerError::Encode)?;
        }
        if let Some(pre_tokenizer) = self.inner.get_pre_tokenizer() {
            pre_tokenizer
                .pre_tokenize(&mut pre)
                .map_err(TokenizerError::Encode)?;
        }
        self.inner
            .get_model()
            .tokenize_in_pretokenized(&mut pre, None)
            .map_err(TokenizerError::Encode)?;
        let encoding = pre
            .into_encoding(None, 0, OffsetType::None)
            .map_err(TokenizerError::Encode)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encode a rendered prompt in which added tokens **are** recognised anywhere (special or
    /// not): exactly `encode(text, add_special_tokens=False)` of the reference tokenizer, which is
    /// what the fixtures record. No BOS/EOS is added beyond those written in `text`.
    ///
    /// Only use it on text whose control tokens were placed deliberately (the chat encoder's
    /// output); user-supplied pieces belong in [`Ds4Tokenizer::encode_text`].
    pub fn encode_with_special(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(TokenizerError::Encode)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decode ids to text, as the reference `decode(ids, skip_special_tokens)` does: byte-level
    /// tokens are joined as bytes and invalid UTF-8 becomes U+FFFD. With `skip_special`, added
    /// tokens flagged special (BOS, EOS, …) are left out; added tokens not flagged special
    /// (`<｜User｜>`, `<think>`, `｜DSML｜`, …) are always kept.
    ///
    /// Any id outside the vocabulary is an error ([`TokenizerError::UnknownId`]).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| !self.contains_id(id)) {
            return Err(self.unknown(id));
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(TokenizerError::Decode)
    }

    /// The id of a vocabulary entry or added token, given its exact string (for BPE entries the
    /// byte-level form, e.g. `"Ġworld"`).
    pub fn token_to_id(&self, tok: &str) -> Option<u32> {
        self.inner.token_to_id(tok)
    }

    /// The string of an id: an added token's content, or a BPE entry in byte-level form
    /// (e.g. `"Ġworld"`); `None` outside the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids, added tokens included: the largest id + 1 (129,280 for V4).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Id of [`BOS_TOKEN`] (0 for V4).
    pub fn bos_id(&self) -> u32 {
        self.bos
    }

    /// Id of [`EOS_TOKEN`] (1 for V4).
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// Whether `id` is an added token flagged special (dropped by `skip_special` decoding).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    fn contains_id(&self, id: u32) -> bool {
        (id as usize) < self.vocab_size && self.inner.id_to_token(id).is_some()
    }

    fn unknown(&self, id: u32) -> TokenizerError {
        TokenizerError::UnknownId {
            id,
            vocab_size: self.vocab_size,
        }
    }

    /// The raw bytes id `id` stands for, exactly as the ByteLevel decoder computes them: a token
    /// made only of byte-level characters maps to those bytes, any other token (an added token
    /// such as `<｜User｜>`) to its own UTF-8.
    fn token_bytes(&self, id: u32, out: &mut Vec<u8>) -> Result<(), TokenizerError> {
        if (id as usize) >= self.vocab_size {
            return Err(self.unknown(id));
        }
        let token = self.inner.id_to_token(id).ok_or_else(|| self.unknown(id))?;
        let start = out.len();
        for c in token.chars() {
            match byte_level_byte(c) {
                Some(b) => out.push(b),
                None => {
                    out.truncate(start);
                    out.extend_from_slice(token.as_bytes());
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// Inverse of GPT-2's `bytes_to_unicode`: the byte a byte-level character stands for.
fn byte_level_byte(c: char) -> Option<u8> {
    static TABLE: OnceLock<[Option<u8>; 324]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [None; 324];
        let mut next = 256usize;
        for b in 0..=255u8 {
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            let code = if printable {
                usize::from(b)
            } else {
                next += 1;
                next - 1
            };
            table[code] = Some(b);
        }
        table
    });
    table.get(c as usize).copied().flatten()
}

/// Incremental detokenizer for streaming output.
///
/// Feed ids one at a time with [`StreamDecoder::push`]; each call returns the text completed by
/// that id (possibly empty while a multi-byte character is still incomplete). After the last id,
/// [`StreamDecoder::finish`] flushes what is held back. The concatenation of all returned pieces
/// equals [`Ds4Tokenizer::decode`] of the same ids with the same `skip_special`, including U+FFFD
/// for byte sequences that never form valid UTF-8.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tok: &'a Ds4Tokenizer,
    skip_special: bool,
    /// Bytes not yet returned: at most an incomplete UTF-8 sequence (< 4 bytes) between calls.
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder with nothing pending; `skip_special` as in [`Ds4Tokenizer::decode`].
    pub fn new(tok: &'a Ds4Tokenizer, skip_special: bool) -> Self {
        Self {
            tok,
            skip_special,
            pending: Vec::with_capacity(16),
        }
    }
}

impl StreamDecoder<'_> {
    /// Add one id and return the newly completed text. An id outside the vocabulary is an error
    /// and leaves the decoder unchanged.
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        if self.skip_special && self.tok.is_special(id) {
            return Ok(String::new());
        }
        self.tok.token_bytes(id, &mut self.pending)?;
        Ok(self.drain_complete())
    }

    /// Flush the held-back bytes (an incomplete UTF-8 sequence becomes U+FFFD, as in the full
    /// decode) and reset the decoder for reuse.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Return every complete character of `pending` (invalid sequences as U+FFFD, like
    /// `String::from_utf8_lossy`), keeping only a trailing sequence that more bytes may complete.
    fn drain_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        while start < self.pending.len() {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(valid) => {
                    out.push_str(valid);
                    start = self.pending.len();
                }
                Err(e) => {
                    let valid_end = start + e.valid_up_to();
                    // Valid by construction; `from_utf8_lossy` avoids an unwrap.
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid_end]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid_end + bad;
                        }
                        None => {
                            start = valid_end;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

#[cfg(test)]
mod tests;
