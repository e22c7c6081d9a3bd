//! Python-compatible JSON and `str()` formatting, as the reference encoder produces them.
//!
//! The reference serialises with `json.dumps(value, ensure_ascii=False)` (section 8 of
//! `chat_encoding_v4.md`), decodes tool-call arguments with `json.loads`, and interpolates
//! non-string values into templates with Python's `str()`. This module reproduces all three on a
//! small value model, [`PyValue`], that keeps what `serde_json::Value` cannot: integers of any size
//! (as their digits), `NaN`/`Infinity`, and Python `dict` semantics for duplicate keys.

use serde_json::{Number, Value};

use super::printable::NON_PRINTABLE;
use super::ChatError;

/// Nesting depth (containers) beyond which `json.loads` in the reference gives up with a
/// `RecursionError`, which the encoder treats like any other decoding failure. The exact figure
/// depends on the Python call stack; this is the value measured for a direct call of
/// `encode_messages` under CPython 3.11.7.
pub(crate) const LOADS_MAX_DEPTH: usize = 990;

/// Nesting depth beyond which serialising or `str()`-formatting fails (`RecursionError` in the
/// reference, an error here). Unreachable from inputs that pass the message depth check.
const DUMPS_MAX_DEPTH: usize = 1000;

/// Python's `int` to `str` conversion limit (`sys.get_int_max_str_digits()`, default 4300).
const INT_MAX_STR_DIGITS: usize = 4300;

/// A JSON value as Python's `json` module sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PyValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An `int`, held as its canonical decimal text (optional `-`, no leading zeros, never `-0`).
    Int(String),
    /// A `float` (may be infinite or NaN).
    Float(f64),
    /// A `str`.
    Str(String),
    /// A `list`.
    List(Vec<PyValue>),
    /// A `dict` with string keys, in insertion order, keys unique.
    Dict(Vec<(String, PyValue)>),
}

impl PyValue {
    /// Converts a `serde_json` value. Numbers are classified by their text: an integer literal
    /// becomes an `int` (all digits kept, as far as `serde_json` kept them), anything else a
    /// `float`.
    pub(crate) fn from_json(v: &Value) -> Result<PyValue, ChatError> {
        from_json_depth(v, 0)
    }
}

fn from_json_depth(v: &Value, depth: usize) -> Result<PyValue, ChatError> {
    if depth > DUMPS_MAX_DEPTH {
        return Err(too_deep());
    }
    Ok(match v {
        Value::Null => PyValue::None,
        Value::Bool(b) => PyValue::Bool(*b),
        Value::Number(n) => number_to_py(n),
        Value::String(s) => PyValue::Str(s.clone()),
        Value::Array(items) => PyValue::List(
            items
                .iter()
                .map(|x| from_json_depth(x, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => PyValue::Dict(
            map.iter()
                .map(|(k, x)| Ok((k.clone(), from_json_depth(x, depth + 1)?)))
                .collect::<Result<_, ChatError>>()?,
        ),
    })
}

fn too_deep() -> ChatError {
    ChatError::Unrepresentable(
        "value nested too deeply (Python would hit its recursion limit)".into(),
    )
}

/// Classifies a `serde_json::Number` the way Python's `json.loads` would have classified the
/// literal it came from. Works with and without `serde_json`'s `arbitrary_precision` feature:
/// without it, non-integers are printed by `ryu`, which always writes a `.` or an exponent.
pub(crate) fn number_to_py(n: &Number) -> PyValue {
    let text = n.to_string();
    if is_int_literal(&text) {
        PyValue::Int(canonical_int(&text))
    } else {
        let f = text
            .parse::<f64>()
            .ok()
            .or_else(|| n.as_f64())
            .unwrap_or(f64::NAN);
        PyValue::Float(f)
    }
}

/// `-?[0-9]+`.
fn is_int_literal(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Canonical text of an integer literal (`-?[0-9]+`): what Python's `str(int(s))` prints.
fn canonical_int(s: &str) -> String {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let trimmed = digits.trim_start_matches('0');
    if trimmed.is_empty() {
        "0".to_string()
    } else if neg {
        format!("-{trimmed}")
    } else {
        trimmed.to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// float formatting
// ---------------------------------------------------------------------------------------------

/// Python `repr(float)` of a finite value: shortest round-trip digits, `.0` or an exponent
/// always present, scientific notation when the decimal exponent is below -4 or at least 16,
/// exponent written with a sign and at least two digits.
fn push_finite_float(x: f64, out: &mut String) {
    if x == 0.0 {
        out.push_str(if x.is_sign_negative() { "-0.0" } else { "0.0" });
        return;
    }
    // Rust's `{:e}` prints the shortest digit string that round-trips (like Python's
    // `repr`), e.g. `1.5e-7`, `1e20`, `1.2345e2`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let n = digits.len() as i32;
    // value = 0.d1d2...dn * 10^decpt
    let decpt = exp + 1;
    if x.is_sign_negative() {
        out.push('-');
    }
    if !(-4 < decpt && decpt <= 16) {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        let e = exp.unsigned_abs();
        if e < 10 {
            out.push('0');
        }
        out.push_str(&e.to_string());
    } else if decpt <= 0 {
        out.push_str("0.");
        for _ in 0..(-decpt) {
            out.push('0');
        }
        out.push_str(&digits);
    } else if decpt >= n {
        out.push_str(&digits);
        for _ in 0..(decpt - n) {
            out.push('0');
        }
        out.push_str(".0");
    } else {
        let split = decpt as usize;
        out.push_str(&digits[..split]);
        out.push('.');
        out.push_str(&digits[split..]);
    }
}

/// Python `repr(x)` / `str(x)` for a float: `inf`, `-inf`, `nan`, or [`push_finite_float`].
pub(crate) fn float_repr(x: f64) -> String {
    let mut s = String::new();
    if x.is_nan() {
        s.push_str("nan");
    } else if x.is_infinite() {
        s.push_str(if x > 0.0 { "inf" } else { "-inf" });
    } else {
        push_finite_float(x, &mut s);
    }
    s
}

/// `json.dumps(x)` for a float: `NaN`, `Infinity`, `-Infinity`, or the Python repr.
pub(crate) fn float_json(x: f64) -> String {
    if x.is_nan() {
        "NaN".to_string()
    } else if x.is_infinite() {
        if x > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
    } else {
        let mut s = String::new();
        push_finite_float(x, &mut s);
        s
    }
}

// ---------------------------------------------------------------------------------------------
// json.dumps(..., ensure_ascii=False)
// ---------------------------------------------------------------------------------------------

/// Appends `json.dumps(s, ensure_ascii=False)`: only `"`, `\` and characters below U+0020 are
/// escaped (`\n`, `\r`, `\t`, `\b`, `\f` by name, the rest as `\u00xx`); everything else,
/// including non-ASCII, U+007F and U+2028/U+2029, is written raw.
pub(crate) fn push_json_str(s: &str, out: &mut String) {
    out.push('"');
    push_json_str_body(s, out);
    out.push('"');
}

/// The inside of [`push_json_str`] (no quotes): usable on consecutive pieces of one string.
pub(crate) fn push_json_str_body(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
}

/// `json.dumps(s, ensure_ascii=False)` of a string.
pub(crate) fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_json_str(s, &mut out);
    out
}

fn check_int_digits(digits: &str) -> Result<(), ChatError> {
    if digits.trim_start_matches('-').len() > INT_MAX_STR_DIGITS {
        return Err(ChatError::Unrepresentable(format!(
            "integer with more than {INT_MAX_STR_DIGITS} digits (Python refuses to convert it to text)"
        )));
    }
    Ok(())
}

/// `json.dumps(value, ensure_ascii=False)` (separators `", "` and `": "`).
pub(crate) fn to_json(v: &PyValue) -> Result<String, ChatError> {
    let mut out = String::new();
    write_value(v, Style::Json, &mut out, 0)?;
    Ok(out)
}

/// `json.dumps` of a `serde_json` value.
pub(crate) fn value_to_json(v: &Value) -> Result<String, ChatError> {
    to_json(&PyValue::from_json(v)?)
}

/// How a value is written: `json.dumps` (default separators, `ensure_ascii`) or Python `repr`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Json,
    Repr,
}

/// Writes `v` in `style`; the two differ only in the scalars' spellings and in string quoting.
fn write_value(v: &PyValue, style: Style, out: &mut String, depth: usize) -> Result<(), ChatError> {
    if depth > DUMPS_MAX_DEPTH {
        return Err(too_deep());
    }
    let json = style == Style::Json;
    let push_str = |s: &str, out: &mut String| if json { push_json_str(s, out) } else { push_str_repr(s, out) };
    match v {
        PyValue::None => out.push_str(if json { "null" } else { "None" }),
        PyValue::Bool(true) => out.push_str(if json { "true" } else { "True" }),
        PyValue::Bool(false) => out.push_str(if json { "false" } else { "False" }),
        PyValue::Int(digits) => {
            check_int_digits(digits)?;
            out.push_str(digits);
        }
        PyValue::Float(x) => out.push_str(&if json { float_json(*x) } else { float_repr(*x) }),
        PyValue::Str(s) => push_str(s, out),
        PyValue::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(item, style, out, depth + 1)?;
            }
            out.push(']');
        }
        PyValue::Dict(items) => {
            out.push('{');
            for (i, (k, item)) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                push_str(k, out);
                out.push_str(": ");
                write_value(item, style, out, depth + 1)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// str() / repr()
// ---------------------------------------------------------------------------------------------

/// Whether CPython 3.11 considers the code point printable (`str.isprintable()`).
fn is_printable(c: char) -> bool {
    let u = c as u32;
    if u < 0x80 {
        return (0x20..0x7f).contains(&u);
    }
    // Binary search in the sorted, disjoint range table.
    let idx = NON_PRINTABLE.partition_point(|&(_, hi)| hi < u);
    !matches!(NON_PRINTABLE.get(idx), Some(&(lo, hi)) if lo <= u && u <= hi)
}

/// Appends Python's `repr(s)` for a `str`.
pub(crate) fn push_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        let u = c as u32;
        if c == quote || c == '\\' {
            out.push('\\');
            out.push(c);
        } else if c == '\t' {
            out.push_str("\\t");
        } else if c == '\n' {
            out.push_str("\\n");
        } else if c == '\r' {
            out.push_str("\\r");
        } else if u < 0x20 || u == 0x7f {
            out.push_str(&format!("\\x{u:02x}"));
        } else if u < 0x7f || is_printable(c) {
            out.push(c);
        } else if u <= 0xff {
            out.push_str(&format!("\\x{u:02x}"));
        } else if u <= 0xffff {
            out.push_str(&format!("\\u{u:04x}"));
        } else {
            out.push_str(&format!("\\U{u:08x}"));
        }
    }
    out.push(quote);
}


/// Python `str(v)`: a `str` is itself, everything else its `repr`.
pub(crate) fn py_str(v: &PyValue) -> Result<String, ChatError> {
    match v {
        PyValue::Str(s) => Ok(s.clone()),
        other => {
            let mut out = String::new();
            write_value(other, Style::Repr, &mut out, 0)?;
            Ok(out)
        }
    }
}

/// Python `str(v)` of an optional `serde_json` value (`None` for an absent value).
pub(crate) fn value_py_str(v: Option<&Value>) -> Result<String, ChatError> {
    match v {
        None | Some(Value::Null) => Ok("None".to_string()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => py_str(&PyValue::from_json(other)?),
    }
}

// ---------------------------------------------------------------------------------------------
// json.loads
// ---------------------------------------------------------------------------------------------

/// Why [`loads`] produced no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadsError {
    /// Python's `json.loads` raises (the encoder catches it and falls back).
    Invalid,
    /// Python decodes the text, but the result holds a lone surrogate (`"\ud800"`), which a
    /// Rust `String` cannot hold.
    LoneSurrogate,
}

/// Python `json.loads(s)` (CPython 3.11 C scanner, default options): `NaN`, `Infinity` and
/// `-Infinity` accepted, control characters inside strings rejected, duplicate keys keep the
/// first position and the last value, integers keep all digits (up to 4300), floats are
/// correctly rounded doubles (overflowing to infinity).
pub(crate) fn loads(s: &str) -> Result<PyValue, LoadsError> {
    let mut p = Loader {
        src: s,
        b: s.as_bytes(),
        pos: 0,
        lone_surrogate: false,
    };
    p.skip_ws();
    let v = p.value(0).map_err(|_| LoadsError::Invalid)?;
    p.skip_ws();
    if p.pos != p.b.len() {
        return Err(LoadsError::Invalid);
    }
    if p.lone_surrogate {
        return Err(LoadsError::LoneSurrogate);
    }
    Ok(v)
}

struct Loader<'a> {
    src: &'a str,
    b: &'a [u8],
    pos: usize,
    lone_surrogate: bool,
}

type Step<T> = Result<T, ()>;

impl Loader<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.b[self.pos..].starts_with(lit.as_bytes()) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Step<PyValue> {
        match self.peek().ok_or(())? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(PyValue::Str),
            b'n' if self.eat("null") => Ok(PyValue::None),
            b't' if self.eat("true") => Ok(PyValue::Bool(true)),
            b'f' if self.eat("false") => Ok(PyValue::Bool(false)),
            b'N' if self.eat("NaN") => Ok(PyValue::Float(f64::NAN)),
            b'I' if self.eat("Infinity") => Ok(PyValue::Float(f64::INFINITY)),
            b'-' if self.eat("-Infinity") => Ok(PyValue::Float(f64::NEG_INFINITY)),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(()),
        }
    }

    fn object(&mut self, depth: usize) -> Step<PyValue> {
        if depth > LOADS_MAX_DEPTH {
            return Err(());
        }
        self.pos += 1; // '{'
        let mut items: Vec<(String, PyValue)> = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(PyValue::Dict(items));
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(());
            }
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(());
            }
            self.pos += 1;
            self.skip_ws();
            let v = self.value(depth)?;
            match items.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = v,
                None => items.push((key, v)),
            }
            self.skip_ws();
            match self.peek() {
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(PyValue::Dict(items));
                }
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                _ => return Err(()),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Step<PyValue> {
        if depth > LOADS_MAX_DEPTH {
            return Err(());
        }
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(PyValue::List(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b']') => {
                    self.pos += 1;
                    return Ok(PyValue::List(items));
                }
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                _ => return Err(()),
            }
        }
    }

    fn hex4(&mut self) -> Step<u32> {
        let h = self.b.get(self.pos..self.pos + 4).ok_or(())?;
        let mut v = 0u32;
        for &c in h {
            v = v * 16 + (c as char).to_digit(16).ok_or(())?;
        }
        self.pos += 4;
        Ok(v)
    }

    fn string(&mut self) -> Step<String> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            // Copy a run of ordinary characters.
            let start = self.pos;
            while let Some(c) = self.peek() {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // `start` and `pos` sit on ASCII bytes (or the ends), so both are char boundaries.
            out.push_str(&self.src[start..self.pos]);
            match self.peek().ok_or(())? {
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => {
                    self.pos += 1;
                    let esc = self.peek().ok_or(())?;
                    self.pos += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let mut c = self.hex4()?;
                            if (0xd800..0xdc00).contains(&c)
                                && self.b[self.pos..].starts_with(b"\\u")
                            {
                                let save = self.pos;
                                self.pos += 2;
                                let c2 = self.hex4()?;
                                if (0xdc00..0xe000).contains(&c2) {
                                    c = 0x10000 + ((c - 0xd800) << 10) + (c2 - 0xdc00);
                                } else {
                                    self.pos = save;
                                }
                            }
                            match char::from_u32(c) {
                                Some(ch) => out.push(ch),
                                None => {
                                    self.lone_surrogate = true;
                                    out.push('\u{fffd}');
                                }
                            }
                        }
                        _ => return Err(()),
                    }
                }
                // A raw control character (strict mode).
                _ => return Err(()),
            }
        }
    }

    fn number(&mut self) -> Step<PyValue> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                while matches!(self.peek(), Some(b'0'..=b'9')) {
                    self.pos += 1;
                }
            }
            _ => return Err(()),
        }
        let mut is_float = false;
        if self.peek() == Some(b'.') && matches!(self.b.get(self.pos + 1), Some(b'0'..=b'9')) {
            is_float = true;
            self.pos += 1;
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.pos += 1;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let save = self.pos;
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if matches!(self.peek(), Some(b'0'..=b'9')) {
                is_float = true;
                while matches!(self.peek(), Some(b'0'..=b'9')) {
                    self.pos += 1;
                }
            } else {
                // Python stops the number before the `e`; whatever follows then fails.
                self.pos = save;
            }
        }
        let text = &self.src[start..self.pos];
        if is_float {
            text.parse::<f64>().map(PyValue::Float).map_err(|_| ())
        } else {
            if text.trim_start_matches('-').len() > INT_MAX_STR_DIGITS {
                // ValueError from int(): caught by the encoder like a decoding error.
                return Err(());
            }
            Ok(PyValue::Int(canonical_int(text)))
        }
    }
}

/// Python's `str.isspace()` (what `\s` matches in a `re` pattern on `str`).
pub(crate) fn py_isspace(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n'
            | '\u{b}'
            | '\u{c}'
            | '\r'
            | '\u{1c}'..='\u{1f}'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}
