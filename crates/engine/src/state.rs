//! Per-sequence incremental state (spec §5): everything a layer needs to continue a sequence
//! token by token — raw K=V rows for the window, each compressor's per-token projections (the
//! incomplete window's buffer and, for CSA, the previous window's overlap half) and its emitted
//! compressed rows (CSA/HCA entries; CSA indexer keys), positions and entry counts.
//!
//! Layout: rows are index-addressed by absolute position, so truncating to a position and
//! snapshot/restore are cheap and exact. With a retention limit `R`, rows older than what a
//! truncation to `pos − R` needs are dropped (a ring of `sliding_window + R` K=V rows); without one,
//! every row is kept and any earlier position can be restored.

/// Rows of a fixed width addressed by absolute position, retaining `[base, end)`.
#[derive(Debug, Clone, Default)]
pub struct Rows {
    width: usize,
    base: usize,
    data: Vec<f32>,
}

impl Rows {
    /// Empty rows of `width` values each.
    pub fn new(width: usize) -> Self {
        Rows { width, base: 0, data: Vec::new() }
    }
    /// One past the last stored position.
    pub fn end(&self) -> usize {
        self.base + self.data.len() / self.width.max(1)
    }
    /// First retained position.
    pub fn base(&self) -> usize {
        self.base
    }
    /// Appends the rows of `values` (a multiple of `width`).
    pub fn extend(&mut self, values: &[f32]) {
        self.data.extend_from_slice(values);
    }
    /// The row at absolute position `pos` (must be retained: `base <= pos < end`).
    pub fn get(&self, pos: usize) -> &[f32] {
        let i = pos - self.base;
        &self.data[i * self.width..(i + 1) * self.width]
    }
    /// Values held for the positions `< end`.
    fn values_before(&self, end: usize) -> usize {
        end.saturating_sub(self.base).min(self.data.len() / self.width.max(1)) * self.width
    }
    /// The rows at positions `< end` (a copy of only those).
    fn prefix(&self, end: usize) -> Rows {
        Rows { width: self.width, base: self.base, data: self.data[..self.values_before(end)].to_vec() }
    }
    /// Drops rows at positions `>= end`.
    pub fn truncate(&mut self, end: usize) {
        self.data.truncate(self.values_before(end));
    }
    /// Drops rows at positions `< new_base`.
    pub fn trim_front(&mut self, new_base: usize) {
        if new_base > self.base {
            let n = (new_base - self.base).min(self.data.len() / self.width.max(1));
            self.data.drain(..n * self.width);
            self.base += n;
        }
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }
    /// The retained rows `[base, end)`, row after row (`(end − base) × width` values).
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }
}

/// State of one compressor (main CSA/HCA compressor, or the CSA indexer's key compressor).
#[derive(Debug, Clone)]
pub struct CompressorState {
    /// Tokens per entry m.
    pub ratio: usize,
    /// Overlapping (CSA) or not (HCA).
    pub overlap: bool,
    /// Per-token `W_kv a_t` rows (width `out`).
    pub kv: Rows,
    /// Per-token biased gate logits (width `out`).
    pub logit: Rows,
    /// Emitted entries `[n_entries, width]` (after norm, RoPE and any official simulation).
    pub entries: Vec<f32>,
    /// Entry width.
    pub width: usize,
}

impl CompressorState {
    /// Entries emitted so far.
    pub fn n_entries(&self) -> usize {
        self.entries.len() / self.width
    }
}

/// State of one layer.
#[derive(Debug, Clone)]
pub struct LayerState {
    /// Raw K=V rows (after RoPE), width head_dim.
    pub kv: Rows,
    /// Main compressor (CSA/HCA layers).
    pub compressor: Option<CompressorState>,
    /// Indexer key compressor (CSA layers).
    pub indexer: Option<CompressorState>,
}

/// Errors of state operations.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Truncation target beyond the current length.
    #[error("cannot truncate to position {target}: the sequence has only {len} tokens")]
    BeyondEnd {
        /// Requested position.
        target: usize,
        /// Current length.
        len: usize,
    },
    /// Truncation target older than what the retention limit kept.
    #[error("cannot truncate to position {target}: with retention {retention} only positions >= {earliest} can be restored; take a snapshot instead")]
    BeyondRetention {
        /// Requested position.
        target: usize,
        /// Earliest restorable position.
        earliest: usize,
        /// Retention limit.
        retention: usize,
    },
}

/// The whole incremental state of one sequence.
#[derive(Debug, Clone)]
pub struct SequenceState {
    /// Tokens processed (the next token's position).
    pub pos: usize,
    /// Per layer.
    pub layers: Vec<LayerState>,
    /// Sliding window W.
    pub window: usize,
    /// Rollback retention: `None` keeps every row (truncate to any position).
    pub retention: Option<usize>,
    /// Earliest position a truncation may target.
    earliest: usize,
}

impl SequenceState {
    /// An empty state for `cfg` with rollback retention `retention` (None = unlimited).
    pub fn new(cfg: &flashseek_model::config::Ds4Config, retention: Option<usize>) -> Self {
        use flashseek_model::config::LayerKind;
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|k| {
                let comp = |width: usize, ratio: usize, overlap: bool| CompressorState {
                    ratio,
                    overlap,
                    kv: Rows::new(if overlap { 2 * width } else { width }),
                    logit: Rows::new(if overlap { 2 * width } else { width }),
                    entries: Vec::new(),
                    width,
                };
                let (compressor, indexer) = match *k {
                    LayerKind::Sliding => (None, None),
                    LayerKind::Hca { ratio } => (Some(comp(cfg.head_dim, ratio, false)), None),
                    LayerKind::Csa { ratio } => {
                        (Some(comp(cfg.head_dim, ratio, true)), Some(comp(cfg.index_head_dim, ratio, true)))
                    }
                };
                LayerState { kv: Rows::new(cfg.head_dim), compressor, indexer }
            })
            .collect();
        SequenceState { pos: 0, layers, window: cfg.sliding_window, retention, earliest: 0 }
    }

    /// Rewinds to `target` tokens: afterwards the state is exactly what processing only the first
    /// `target` tokens would have produced (rows and entries past it are dropped; the incomplete
    /// window's buffer is whatever of its tokens remain).
    ///
    /// Errors: `target` beyond the current length, or older than the retention limit allows.
    pub fn truncate(&mut self, target: usize) -> Result<(), StateError> {
        self.check_target(target)?;
        for l in &mut self.layers {
            l.kv.truncate(target);
            for c in [&mut l.compressor, &mut l.indexer].into_iter().flatten() {
                c.kv.truncate(target);
                c.logit.truncate(target);
                let keep = target / c.ratio;
                c.entries.truncate(keep * c.width);
            }
        }
        self.pos = target;
        self.earliest = self.earliest.min(target);
        Ok(())
    }

    /// Whether the state can go back to `target` tokens (not beyond its end, not before what the
    /// retention limit kept).
    fn check_target(&self, target: usize) -> Result<(), StateError> {
        if target > self.pos {
            return Err(StateError::BeyondEnd { target, len: self.pos });
        }
        if target < self.earliest {
            return Err(StateError::BeyondRetention { target, earliest: self.earliest, retention: self.retention.unwrap_or(0) });
        }
        Ok(())
    }

    /// A copy of the state of the first `target` tokens: what [`SequenceState::truncate`] would
    /// leave, copying only those rows and entries (this state is unchanged).
    ///
    /// Errors: as [`SequenceState::truncate`].
    pub fn prefix(&self, target: usize) -> Result<SequenceState, StateError> {
        self.check_target(target)?;
        let comp = |c: &CompressorState| CompressorState {
            ratio: c.ratio,
            overlap: c.overlap,
            kv: c.kv.prefix(target),
            logit: c.logit.prefix(target),
            entries: c.entries[..(target / c.ratio).min(c.n_entries()) * c.width].to_vec(),
            width: c.width,
        };
        let layers = self.layers.iter().map(|l| LayerState { kv: l.kv.prefix(target), compressor: l.compressor.as_ref().map(comp), indexer: l.indexer.as_ref().map(comp) }).collect();
        Ok(SequenceState { pos: target, layers, window: self.window, retention: self.retention, earliest: self.earliest.min(target) })
    }

    /// After appending tokens up to `self.pos`, drops rows no longer needed under the retention limit.
    pub(crate) fn trim(&mut self) {
        let Some(r) = self.retention else { return };
        let earliest = self.pos.saturating_sub(r).max(self.earliest);
        self.earliest = earliest;
        let w = self.window;
        for l in &mut self.layers {
            // The window of the first token after `earliest` reaches back W−1 rows.
            l.kv.trim_front((earliest + 1).saturating_sub(w));
            for c in [&mut l.compressor, &mut l.indexer].into_iter().flatten() {
                // Continuing from `earliest` needs its incomplete window and, for CSA, the window before.
                let start = (earliest / c.ratio).saturating_sub(usize::from(c.overlap)) * c.ratio;
                c.kv.trim_front(start);
                c.logit.trim_front(start);
            }
        }
    }

    /// Bytes held by the state.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                l.kv.bytes()
                    + [&l.compressor, &l.indexer]
                        .into_iter()
                        .flatten()
                        .map(|c| c.kv.bytes() + c.logit.bytes() + c.entries.len() * 4)
                        .sum::<usize>()
            })
            .sum()
    }

    /// Earliest position a truncation may target (0 without a retention limit).
    pub fn earliest(&self) -> usize {
        self.earliest
    }

    /// A copy of the whole state (restore by assigning it back).
    pub fn snapshot(&self) -> SequenceState {
        self.clone()
    }
}
