//! Tests: the shared fixtures (render and parse), the streaming parser against the one-shot
//! parser, and the Python-compatible formatting. Expected values in the tables below were
//! produced by CPython 3.11.7 (`json.dumps(x, ensure_ascii=False)` and `repr(x)`).

use serde_json::Value;

use super::pyjson::{self, LoadsError, PyValue};
use super::*;

const CHAT_FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/fixtures/chat_v4.jsonl"
);
const PARSE_FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/fixtures/chat_v4_parse.jsonl"
);

fn read_jsonl(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

/// Runs one `chat_v4.jsonl` request; option strings that the reference rejects are errors too.
fn run_request(req: &Value) -> Result<String, ChatError> {
    let mode: ThinkingMode = req["thinking_mode"].as_str().unwrap_or("").parse()?;
    let effort = match &req["reasoning_effort"] {
        Value::Null => None,
        Value::String(s) => Some(s.parse::<ReasoningEffort>()?),
        other => panic!("unexpected reasoning_effort {other}"),
    };
    let context = match &req["context"] {
        Value::Null => None,
        Value::Array(a) => Some(a.clone()),
        other => panic!("unexpected context {other}"),
    };
    let opts = EncodeOptions {
        thinking_mode: mode,
        reasoning_effort: effort,
        drop_thinking: req["drop_thinking"].as_bool().expect("drop_thinking"),
        add_default_bos_token: req["add_default_bos_token"]
            .as_bool()
            .expect("add_default_bos_token"),
        context,
    };
    let messages = req["messages"].as_array().expect("messages");
    encode_messages(messages, &opts)
}

#[test]
fn chat_fixtures_render() {
    let cases = read_jsonl(CHAT_FIXTURES);
    assert_eq!(cases.len(), 56, "fixture count");
    let (mut rendered, mut errors) = (0, 0);
    for case in &cases {
        let id = case["id"].as_str().unwrap();
        let got = run_request(&case["request"]);
        match (case.get("rendered"), case.get("error")) {
            (Some(Value::String(want)), None) => {
                let got = got.unwrap_or_else(|e| panic!("{id}: unexpected error {e}"));
                if &got != want {
                    let at = got
                        .bytes()
                        .zip(want.bytes())
                        .position(|(a, b)| a != b)
                        .unwrap_or(got.len().min(want.len()));
                    panic!(
                        "{id}: rendered text differs at byte {at}\n got: {:?}\nwant: {:?}",
                        &got[got.floor_char_boundary_compat(at.saturating_sub(60))..],
                        &want[want.floor_char_boundary_compat(at.saturating_sub(60))..]
                    );
                }
                rendered += 1;
            }
            (None, Some(Value::String(err))) => {
                assert!(got.is_err(), "{id}: expected error ({err}), got {got:?}");
                errors += 1;
            }
            _ => panic!("{id}: malformed fixture"),
        }
    }
    assert_eq!((rendered, errors), (50, 6));
}

trait FloorBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorBoundary for String {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

struct ParseCase {
    id: String,
    mode: ThinkingMode,
    text: String,
    want: Option<ParsedMessage>,
}

fn parse_cases() -> Vec<ParseCase> {
    parse_cases_from(PARSE_FIXTURES)
}

fn parse_cases_from(path: &str) -> Vec<ParseCase> {
    read_jsonl(path)
        .iter()
        .map(|case| {
            let want = case.get("parsed").map(|p| {
                assert_eq!(p["role"], "assistant");
                ParsedMessage {
                    content: p["content"].as_str().unwrap().to_string(),
                    reasoning_content: p["reasoning_content"].as_str().unwrap().to_string(),
                    tool_calls: p["tool_calls"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|tc| {
                            assert_eq!(tc["type"], "function");
                            ToolCall {
                                name: tc["function"]["name"].as_str().unwrap().to_string(),
                                arguments: tc["function"]["arguments"]
                                    .as_str()
                                    .unwrap()
                                    .to_string(),
                            }
                        })
                        .collect(),
                }
            });
            assert!(
                want.is_some() != case.get("error").is_some(),
                "parsed xor error"
            );
            ParseCase {
                id: case["id"].as_str().unwrap().to_string(),
                mode: case["thinking_mode"].as_str().unwrap().parse().unwrap(),
                text: case["text"].as_str().unwrap().to_string(),
                want,
            }
        })
        .collect()
}

#[test]
fn chat_fixtures_parse() {
    let cases = parse_cases();
    assert_eq!(cases.len(), 28, "fixture count");
    let (mut ok, mut errors) = (0, 0);
    for c in &cases {
        let got = parse_completion(&c.text, c.mode);
        match &c.want {
            Some(want) => {
                assert_eq!(got.as_ref(), Ok(want), "{}", c.id);
                ok += 1;
            }
            None => {
                assert!(got.is_err(), "{}: expected an error, got {got:?}", c.id);
                errors += 1;
            }
        }
    }
    assert_eq!((ok, errors), (15, 13));
}

// ---------------------------------------------------------------------------------------------
// streaming
// ---------------------------------------------------------------------------------------------

/// What a stream of events adds up to; checks the event protocol on the way.
#[derive(Debug, Default, PartialEq)]
struct Assembled {
    reasoning: String,
    content: String,
    calls: Vec<(String, String)>,
    open_call: bool,
}

impl Assembled {
    fn apply(&mut self, ev: &StreamEvent) {
        match ev {
            StreamEvent::Reasoning(s) => {
                assert!(
                    self.content.is_empty() && self.calls.is_empty(),
                    "reasoning after content"
                );
                assert!(!s.is_empty(), "empty reasoning event");
                self.reasoning.push_str(s);
            }
            StreamEvent::Content(s) => {
                assert!(self.calls.is_empty(), "content after a tool call");
                assert!(!s.is_empty(), "empty content event");
                self.content.push_str(s);
            }
            StreamEvent::ToolCallStart { index, name } => {
                assert!(!self.open_call, "call started while another is open");
                assert_eq!(*index, self.calls.len(), "call index");
                self.calls.push((name.clone(), String::new()));
                self.open_call = true;
            }
            StreamEvent::ToolCallArguments { index, delta } => {
                assert!(self.open_call, "arguments outside a call");
                assert_eq!(*index + 1, self.calls.len(), "arguments index");
                assert!(!delta.is_empty(), "empty arguments event");
                self.calls.last_mut().unwrap().1.push_str(delta);
            }
            StreamEvent::ToolCallEnd { index } => {
                assert!(self.open_call, "end outside a call");
                assert_eq!(*index + 1, self.calls.len(), "end index");
                self.open_call = false;
            }
        }
    }

    fn matches(&self, msg: &ParsedMessage) -> bool {
        !self.open_call
            && self.reasoning == msg.reasoning_content
            && self.content == msg.content
            && self.calls.len() == msg.tool_calls.len()
            && self
                .calls
                .iter()
                .zip(&msg.tool_calls)
                .all(|((n, a), tc)| *n == tc.name && *a == tc.arguments)
    }
}

/// Deterministic pseudo-random numbers (64-bit LCG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Splits `text` into pieces of `sizes()` characters each.
fn split_chars(text: &str, mut size: impl FnMut() -> usize) -> Vec<&str> {
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    let mut pieces = Vec::new();
    let mut at = 0;
    while at + 1 < bounds.len() {
        let next = (at + size().max(1)).min(bounds.len() - 1);
        pieces.push(&text[bounds[at]..bounds[next]]);
        at = next;
    }
    pieces
}

/// Streams `pieces`; checks finish() against parse_completion and, when the text parses, the
/// events against the parsed message. Returns whether the text parses.
fn check_stream(label: &str, mode: ThinkingMode, pieces: &[&str]) -> bool {
    let text: String = pieces.concat();
    let want = parse_completion(&text, mode);
    let mut parser = StreamParser::new(mode);
    let mut asm = Assembled::default();
    for piece in pieces {
        for ev in parser.push(piece) {
            asm.apply(&ev);
        }
    }
    for ev in parser.end_of_input() {
        asm.apply(&ev);
    }
    assert_eq!(parser.text(), text);
    let failed = parser.is_failed();
    let got = parser.finish();
    assert_eq!(got, want, "{label}: finish() differs from parse_completion");
    match &want {
        Ok(msg) => {
            assert!(
                !failed,
                "{label}: stream marked failed for a valid completion {text:?}"
            );
            assert!(
                asm.matches(msg),
                "{label}: events {asm:?} do not add up to {msg:?} (text {text:?})"
            );
            true
        }
        Err(_) => false,
    }
}

#[test]
fn chat_stream_matches_parse_on_fixtures() {
    let mut rng = Lcg(0x5eed);
    for c in parse_cases() {
        check_stream(&format!("{} whole", c.id), c.mode, &[&c.text]);
        check_stream(
            &format!("{} chars", c.id),
            c.mode,
            &split_chars(&c.text, || 1),
        );
        for round in 0..20 {
            let pieces = split_chars(&c.text, || 1 + rng.below(7));
            let ok = check_stream(&format!("{} chunks#{round}", c.id), c.mode, &pieces);
            assert_eq!(ok, c.want.is_some(), "{}", c.id);
        }
        for round in 0..5 {
            let pieces = split_chars(&c.text, || 1 + rng.below(40));
            check_stream(&format!("{} big chunks#{round}", c.id), c.mode, &pieces);
        }
    }
}

#[test]
fn chat_stream_matches_parse_on_every_prefix() {
    // Truncated completions exercise the corner cases the reference accepts (a tool-call block
    // cut off right after a complete call) and everything it rejects.
    let mut accepted = 0;
    for c in parse_cases() {
        let bounds: Vec<usize> = c
            .text
            .char_indices()
            .map(|(i, _)| i)
            .chain([c.text.len()])
            .collect();
        for &end in &bounds {
            let prefix = &c.text[..end];
            for mode in [ThinkingMode::Chat, ThinkingMode::Thinking] {
                let label = format!("{} prefix {end} {mode}", c.id);
                if check_stream(&label, mode, &split_chars(prefix, || 1)) {
                    accepted += 1;
                }
                check_stream(&label, mode, &[prefix]);
            }
        }
    }
    assert!(accepted > 28, "too few accepted prefixes: {accepted}");
}

#[test]
fn chat_stream_matches_parse_on_random_completions() {
    const FRAGMENTS: &[&str] = &[
        "Hello", " world", "<", ">", "\n", "\n\n", "\"", "/", "｜", "x", "é😀", "<think>", "</think>",
        "</thi", "<｜end▁of▁sentence｜>", "<｜end▁of", "\n\n<｜DSML｜tool_calls>\n", "<｜DSML｜tool_calls>",
        "</｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"get\">\n", "<｜DSML｜invoke name=\"a\nb\">\n\n",
        "<｜DSML｜invoke", " name=\"f\">\n", "</｜DSML｜invoke>\n", "</｜DSML｜invoke",
        "<｜DSML｜parameter name=\"p\" string=\"true\">v</｜DSML｜parameter>\n",
        "<｜DSML｜parameter name=\"q\" string=\"false\">{\"a\": [1, 2]}</｜DSML｜parameter>\n",
        "<｜DSML｜parameter name=\"r\" string=\"true\">line\n\"quoted\"\t<tag>\n</｜DSML｜parameter>\n",
        "<｜DSML｜parameter name=\"s\" string=\"true\">a<\n/｜DSML｜parameter>\n",
        "<｜DSML｜parameter name=\"\" string=\"true\" string=\"false\">v</｜DSML｜parameter>\n",
        "<｜DSML｜parameter", " name=\"t\" string=\"true\">", "</｜DSML｜parameter>\n", "/｜DSML｜parameter",
        "｜DSML｜", "<｜begin▁of▁sentence｜>",
    ];
    let mut rng = Lcg(42);
    let mut accepted = 0;
    for round in 0..6000 {
        let mode = if round % 2 == 0 {
            ThinkingMode::Chat
        } else {
            ThinkingMode::Thinking
        };
        let mut text = String::new();
        if mode == ThinkingMode::Thinking && rng.below(4) != 0 {
            text.push_str("reasoning ");
            text.push_str(FRAGMENTS[rng.below(FRAGMENTS.len())]);
            text.push_str("</think>");
        }
        if rng.below(3) == 0 {
            text.push_str("content");
        }
        // Bias towards well-formed tool-call blocks.
        if rng.below(2) == 0 {
            text.push_str("\n\n<｜DSML｜tool_calls>\n");
            for _ in 0..rng.below(3) {
                text.push_str(FRAGMENTS[19 + rng.below(3)]);
                for _ in 0..rng.below(3) {
                    text.push_str(FRAGMENTS[25 + rng.below(5)]);
                }
                text.push_str("</｜DSML｜invoke>\n");
            }
            if rng.below(3) != 0 {
                text.push_str("</｜DSML｜tool_calls>");
            }
        }
        for _ in 0..rng.below(3) {
            text.push_str(FRAGMENTS[rng.below(FRAGMENTS.len())]);
        }
        if rng.below(4) != 0 {
            text.push_str(EOS);
        }
        let label = format!("random #{round}");
        if check_stream(&label, mode, &split_chars(&text, || 1)) {
            accepted += 1;
        }
        let pieces = split_chars(&text, || 1 + rng.below(9));
        check_stream(&label, mode, &pieces);
    }
    assert!(
        accepted > 300,
        "too few accepted random completions: {accepted}"
    );
}

// ---------------------------------------------------------------------------------------------
// Python-compatible formatting
// ---------------------------------------------------------------------------------------------

const STRING_CASES: &[(&str, &str, &str)] = &[
    ("", "\"\"", "''"),
    ("plain", "\"plain\"", "'plain'"),
    ("quote\"d", "\"quote\\\"d\"", "'quote\"d'"),
    ("back\\slash", "\"back\\\\slash\"", "'back\\\\slash'"),
    ("new\u{a}line", "\"new\\nline\"", "'new\\nline'"),
    ("tab\u{9}cr\u{d}", "\"tab\\tcr\\r\"", "'tab\\tcr\\r'"),
    ("\u{8}\u{c}", "\"\\b\\f\"", "'\\x08\\x0c'"),
    (
        "\u{0}\u{1}\u{1f}",
        "\"\\u0000\\u0001\\u001f\"",
        "'\\x00\\x01\\x1f'",
    ),
    ("\u{7f}", "\"\u{7f}\"", "'\\x7f'"),
    ("caf\u{e9}", "\"caf\u{e9}\"", "'caf\u{e9}'"),
    (
        "\u{4e2d}\u{6587} \u{1f600}",
        "\"\u{4e2d}\u{6587} \u{1f600}\"",
        "'\u{4e2d}\u{6587} \u{1f600}'",
    ),
    (
        "\u{2028}\u{2029}",
        "\"\u{2028}\u{2029}\"",
        "'\\u2028\\u2029'",
    ),
    (
        "\u{85}\u{a0}\u{ad}",
        "\"\u{85}\u{a0}\u{ad}\"",
        "'\\x85\\xa0\\xad'",
    ),
    ("/slash/", "\"/slash/\"", "'/slash/'"),
    ("it's", "\"it's\"", "\"it's\""),
    ("both ' and \"", "\"both ' and \\\"\"", "'both \\' and \"'"),
    (
        "\u{200b}\u{feff}\u{e0001}",
        "\"\u{200b}\u{feff}\u{e0001}\"",
        "'\\u200b\\ufeff\\U000e0001'",
    ),
    ("\u{e000}", "\"\u{e000}\"", "'\\ue000'"),
    ("\u{10ffff}", "\"\u{10ffff}\"", "'\\U0010ffff'"),
    ("\u{378}", "\"\u{378}\"", "'\\u0378'"),
    ("'", "\"'\"", "\"'\""),
    ("\"", "\"\\\"\"", "'\"'"),
    ("\u{e9}\u{80}", "\"\u{e9}\u{80}\"", "'\u{e9}\\x80'"),
    (
        "\u{3000}\u{1680}",
        "\"\u{3000}\u{1680}\"",
        "'\\u3000\\u1680'",
    ),
    (
        "\u{1f9d1}\u{200d}\u{1f4bb}",
        "\"\u{1f9d1}\u{200d}\u{1f4bb}\"",
        "'\u{1f9d1}\\u200d\u{1f4bb}'",
    ),
    ("a\u{301}", "\"a\u{301}\"", "'a\u{301}'"),
    ("\u{61c}\u{ad}", "\"\u{61c}\u{ad}\"", "'\\u061c\\xad'"),
];
const NUMBER_CASES: &[(&str, &str, &str)] = &[
    ("-0.0", "-0.0", "-0.0"),
    ("5", "5", "5"),
    ("6", "6", "6"),
    ("7", "7", "7"),
    ("9", "9", "9"),
    ("17", "17", "17"),
    ("18", "18", "18"),
    ("21", "21", "21"),
    ("22", "22", "22"),
    ("24", "24", "24"),
    ("2026", "2026", "2026"),
    ("0.5", "0.5", "0.5"),
    ("0.50", "0.5", "0.5"),
    ("1.0", "1.0", "1.0"),
    ("1.5e-7", "1.5e-07", "1.5e-07"),
    ("1000.0", "1000.0", "1000.0"),
    ("1e3", "1000.0", "1000.0"),
    ("1e20", "1e+20", "1e+20"),
    (
        "123456789012345678901234567890",
        "123456789012345678901234567890",
        "123456789012345678901234567890",
    ),
    ("1024", "1024", "1024"),
    ("25", "25", "25"),
    ("0", "0", "0"),
    ("-0", "0", "0"),
    ("100", "100", "100"),
    ("10", "10", "10"),
    ("30", "30", "30"),
    ("1", "1", "1"),
    ("2", "2", "2"),
    ("3", "3", "3"),
    ("1e16", "1e+16", "1e+16"),
    ("1e15", "1000000000000000.0", "1000000000000000.0"),
    ("1e-4", "0.0001", "0.0001"),
    ("1e-5", "1e-05", "1e-05"),
    ("0.0001", "0.0001", "0.0001"),
    ("0.00001", "1e-05", "1e-05"),
    ("5e-324", "5e-324", "5e-324"),
    (
        "1.7976931348623157e308",
        "1.7976931348623157e+308",
        "1.7976931348623157e+308",
    ),
    ("1e400", "Infinity", "inf"),
    ("-1e400", "-Infinity", "-inf"),
    ("0.1", "0.1", "0.1"),
    (
        "0.30000000000000004",
        "0.30000000000000004",
        "0.30000000000000004",
    ),
    ("123456789.123", "123456789.123", "123456789.123"),
    ("1e22", "1e+22", "1e+22"),
    ("9007199254740993", "9007199254740993", "9007199254740993"),
    ("-12.5e-3", "-0.0125", "-0.0125"),
    ("2.5E+2", "250.0", "250.0"),
    ("1.0e0", "1.0", "1.0"),
    (
        "9999999999999998.0",
        "9999999999999998.0",
        "9999999999999998.0",
    ),
    (
        "1234567890123456789.0",
        "1.2345678901234568e+18",
        "1.2345678901234568e+18",
    ),
    ("0.000123", "0.000123", "0.000123"),
    ("-7", "-7", "-7"),
    ("3.14159", "3.14159", "3.14159"),
    ("6.02214076e23", "6.02214076e+23", "6.02214076e+23"),
    ("1e-7", "1e-07", "1e-07"),
    ("1e+308", "1e+308", "1e+308"),
    ("2e-308", "2e-308", "2e-308"),
    ("4.9406564584124654e-324", "5e-324", "5e-324"),
    (
        "2.2250738585072014e-308",
        "2.2250738585072014e-308",
        "2.2250738585072014e-308",
    ),
    (
        "18446744073709551615",
        "18446744073709551615",
        "18446744073709551615",
    ),
    (
        "18446744073709551616",
        "18446744073709551616",
        "18446744073709551616",
    ),
    (
        "-9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775808",
    ),
    (
        "-9223372036854775809",
        "-9223372036854775809",
        "-9223372036854775809",
    ),
    ("1E2", "100.0", "100.0"),
    ("0.1e1", "1.0", "1.0"),
    ("100000000000000000.0", "1e+17", "1e+17"),
    (
        "12345678901234567.0",
        "1.2345678901234568e+16",
        "1.2345678901234568e+16",
    ),
    ("1e99999999999999999999", "Infinity", "inf"),
    ("-1e-99999999999999999999", "-0.0", "-0.0"),
    ("0.000099999", "9.9999e-05", "9.9999e-05"),
    ("123e-20", "1.23e-18", "1.23e-18"),
    ("-0.0e5", "-0.0", "-0.0"),
    ("1.25", "1.25", "1.25"),
    ("2.675", "2.675", "2.675"),
    ("1e-320", "1e-320", "1e-320"),
];

#[test]
fn chat_json_string_formatting_matches_python() {
    for (input, json, repr) in STRING_CASES {
        assert_eq!(pyjson::json_str(input), *json, "json.dumps({input:?})");
        let v = PyValue::Str(input.to_string());
        assert_eq!(pyjson::to_json(&v).unwrap(), *json);
        // str() of a list shows the repr of its items.
        let list = PyValue::List(vec![v]);
        assert_eq!(
            pyjson::py_str(&list).unwrap(),
            format!("[{repr}]"),
            "repr({input:?})"
        );
        // json.loads(json.dumps(s)) == s
        assert_eq!(pyjson::loads(json), Ok(PyValue::Str(input.to_string())));
    }
}

#[test]
fn chat_number_formatting_matches_python() {
    for (literal, json, repr) in NUMBER_CASES {
        let v = pyjson::loads(literal).unwrap_or_else(|e| panic!("loads({literal}): {e:?}"));
        assert_eq!(
            pyjson::to_json(&v).unwrap(),
            *json,
            "json.dumps(json.loads({literal:?}))"
        );
        assert_eq!(
            pyjson::py_str(&v).unwrap(),
            *repr,
            "repr(json.loads({literal:?}))"
        );
        // The same number arriving as a serde_json value (when serde_json keeps it exactly).
        if let Ok(Value::Number(n)) = serde_json::from_str::<Value>(literal) {
            let exact = match &v {
                PyValue::Float(f) => n.as_f64() == Some(*f) && *literal != "-0",
                PyValue::Int(_) => n.is_i64() || n.is_u64(),
                _ => false,
            };
            if exact {
                assert_eq!(
                    pyjson::value_to_json(&Value::Number(n)).unwrap(),
                    *json,
                    "serde {literal}"
                );
            }
        }
    }
}

/// Every number token outside of strings in a JSON text.
fn number_tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut in_str = false;
    let mut cur = String::new();
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        if c.is_ascii_digit()
            || (matches!(c, '-' | '+' | '.' | 'e' | 'E') && (!cur.is_empty() || c == '-'))
        {
            cur.push(c);
            continue;
        }
        if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        if c == '"' {
            in_str = true;
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn collect_numbers(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Number(n) => out.push(n.to_string()),
        Value::String(s) if pyjson::loads(s).is_ok() => out.extend(number_tokens(s)),
        Value::Array(a) => a.iter().for_each(|x| collect_numbers(x, out)),
        Value::Object(o) => o.values().for_each(|x| collect_numbers(x, out)),
        _ => {}
    }
}

#[test]
fn chat_every_fixture_number_is_formatted_like_python() {
    let mut numbers = Vec::new();
    for case in read_jsonl(CHAT_FIXTURES) {
        collect_numbers(&case["request"], &mut numbers);
    }
    numbers.sort();
    numbers.dedup();
    assert!(numbers.len() > 15, "{numbers:?}");
    for literal in &numbers {
        let Some((_, json, _)) = NUMBER_CASES.iter().find(|(l, _, _)| l == literal) else {
            panic!("fixture number {literal} missing from NUMBER_CASES");
        };
        let v = pyjson::loads(literal).unwrap();
        assert_eq!(pyjson::to_json(&v).unwrap(), *json, "{literal}");
    }
}

#[test]
fn chat_json_dumps_structures() {
    let v = pyjson::loads(
        r#"{"b": [1, 2.50, {"c": null}], "a": true, "b": {"x": "y"}, "e": [], "f": {}}"#,
    )
    .unwrap();
    // Duplicate key: first position, last value (Python dict semantics).
    assert_eq!(
        pyjson::to_json(&v).unwrap(),
        r#"{"b": {"x": "y"}, "a": true, "e": [], "f": {}}"#
    );
    assert_eq!(
        pyjson::py_str(&v).unwrap(),
        "{'b': {'x': 'y'}, 'a': True, 'e': [], 'f': {}}"
    );
    let v = pyjson::loads(" [NaN, Infinity, -Infinity, null, false] \n").unwrap();
    assert_eq!(
        pyjson::to_json(&v).unwrap(),
        "[NaN, Infinity, -Infinity, null, false]"
    );
    assert_eq!(pyjson::py_str(&v).unwrap(), "[nan, inf, -inf, None, False]");
}

#[test]
fn chat_json_loads_rejects_what_python_rejects() {
    for bad in [
        "",
        " ",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "01",
        "1.",
        ".5",
        "1e",
        "1e+",
        "-",
        "+1",
        "--1",
        "nul",
        "True",
        "nan",
        "-NaN",
        "'a'",
        "\"a\nb\"",
        "\"\\x41\"",
        "\"\\u12\"",
        "\"\\ud800\\uzzzz\"",
        "{a: 1}",
        "[1 2]",
        "1 2",
        "\u{feff}{}",
        "\"unterminated",
        "{\"a\" 1}",
        "[",
        "]",
    ] {
        assert_eq!(pyjson::loads(bad), Err(LoadsError::Invalid), "{bad:?}");
    }
    assert_eq!(
        pyjson::loads(&"1".repeat(4300)),
        Ok(PyValue::Int("1".repeat(4300)))
    );
    assert_eq!(pyjson::loads(&"1".repeat(4301)), Err(LoadsError::Invalid));
    assert_eq!(
        pyjson::loads(&format!("-{}", "1".repeat(4300))),
        Ok(PyValue::Int(format!("-{}", "1".repeat(4300))))
    );
    let deep_ok = format!(
        "{}{}",
        "[".repeat(pyjson::LOADS_MAX_DEPTH),
        "]".repeat(pyjson::LOADS_MAX_DEPTH)
    );
    assert!(pyjson::loads(&deep_ok).is_ok());
    let too_deep = format!("[{deep_ok}]");
    assert_eq!(pyjson::loads(&too_deep), Err(LoadsError::Invalid));
    assert_eq!(
        pyjson::loads("\"\\ud83d\\ude00\""),
        Ok(PyValue::Str("😀".into()))
    );
    assert_eq!(pyjson::loads("\"\\ud800\""), Err(LoadsError::LoneSurrogate));
    assert_eq!(
        pyjson::loads("\"\\udc00\\ud800\""),
        Err(LoadsError::LoneSurrogate)
    );
    assert_eq!(
        pyjson::loads("\"\\/\\b\\f\\n\\r\\t\\\"\\\\\\u00e9\\u00E9\""),
        Ok(PyValue::Str("/\u{8}\u{c}\n\r\t\"\\éé".into()))
    );
}

/// Differential check against records produced by running the reference encoder on generated
/// requests (same format as `chat_v4.jsonl`). Run with
/// `CHAT_V4_DIFF=/path/file.jsonl cargo test -p flashseek-model chat_differential -- --ignored`.
#[test]
#[ignore = "needs CHAT_V4_DIFF pointing at reference outputs"]
fn chat_differential_file() {
    let Ok(path) = std::env::var("CHAT_V4_DIFF") else {
        return;
    };
    let mut failures = Vec::new();
    let cases = read_jsonl(&path);
    for case in &cases {
        let id = case["id"].as_str().unwrap_or("?");
        let got = run_request(&case["request"]);
        let ok = match (case.get("rendered"), &got) {
            (Some(Value::String(want)), Ok(g)) => g == want,
            (None, Err(_)) => true,
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{id}: got {got:?}\nwant {:?} / {:?}\nrequest {}",
                case.get("rendered"),
                case.get("error"),
                case["request"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        cases.len(),
        failures[..failures.len().min(5)].join("\n\n")
    );
}

/// Differential check of the parsers against records produced by running the reference parser
/// on generated completions (same format as `chat_v4_parse.jsonl`). Run with
/// `CHAT_V4_PARSE_DIFF=/path/file.jsonl cargo test -p flashseek-model chat_parse_differential -- --ignored`.
#[test]
#[ignore = "needs CHAT_V4_PARSE_DIFF pointing at reference outputs"]
fn chat_parse_differential_file() {
    let Ok(path) = std::env::var("CHAT_V4_PARSE_DIFF") else {
        return;
    };
    let mut rng = Lcg(7);
    for c in parse_cases_from(&path) {
        let got = parse_completion(&c.text, c.mode);
        match &c.want {
            Some(want) => assert_eq!(got.as_ref(), Ok(want), "{} {:?}", c.id, c.text),
            None => assert!(
                got.is_err(),
                "{}: expected an error, got {got:?} for {:?}",
                c.id,
                c.text
            ),
        }
        check_stream(&c.id, c.mode, &split_chars(&c.text, || 1));
        check_stream(&c.id, c.mode, &split_chars(&c.text, || 1 + rng.below(6)));
    }
}

#[test]
fn chat_stream_long_text_is_fast() {
    // Pushing a long completion one character at a time must stay linear.
    let reasoning = "step < by > step \n".repeat(20_000);
    let value = "line \"q\" <x>\n".repeat(10_000);
    let text = format!(
        "{reasoning}</think>{reasoning}\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"v\" string=\"true\">{value}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>{EOS}"
    );
    let start = std::time::Instant::now();
    assert!(check_stream(
        "long",
        ThinkingMode::Thinking,
        &split_chars(&text, || 1)
    ));
    assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
}

#[test]
fn chat_encode_depth_limits_and_rejections() {
    fn nested(depth: usize) -> Value {
        let mut v = Value::Array(Vec::new());
        for _ in 1..depth {
            v = Value::Array(vec![v]);
        }
        v
    }
    let opts = EncodeOptions::new(ThinkingMode::Chat);
    // A system message holding a tool whose function is `depth` arrays deep: the message has
    // depth + 3 levels (message, tools list, tool object).
    let system = |depth: usize| serde_json::json!([{"role": "system", "content": "", "tools": [{"function": nested(depth)}]}]);
    let ok = encode_messages(system(MAX_MESSAGE_DEPTH - 3).as_array().unwrap(), &opts).unwrap();
    assert!(ok.contains("[[[]]]"));
    assert!(matches!(
        encode_messages(system(MAX_MESSAGE_DEPTH - 2).as_array().unwrap(), &opts),
        Err(ChatError::Unrepresentable(_))
    ));

    // Tool-call arguments nested too deeply for Python's json.loads fall back to one string parameter.
    let call = |args: String| serde_json::json!([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": args}}]}]);
    let depth = pyjson::LOADS_MAX_DEPTH - 1;
    let args = format!("{{\"a\": {}{}}}", "[".repeat(depth), "]".repeat(depth));
    let out = encode_messages(call(args.clone()).as_array().unwrap(), &opts).unwrap();
    assert!(out.contains("name=\"a\" string=\"false\">[["));
    let args = format!("{{\"a\": [{}{}]}}", "[".repeat(depth), "]".repeat(depth));
    let out = encode_messages(call(args.clone()).as_array().unwrap(), &opts).unwrap();
    assert!(out.contains(&format!("name=\"arguments\" string=\"true\">{args}<")));

    // Lone surrogates cannot be rendered into a Rust string.
    assert!(matches!(
        encode_messages(call(r#"{"a": "\ud800"}"#.into()).as_array().unwrap(), &opts),
        Err(ChatError::Unrepresentable(_))
    ));

    // Shapes the reference raises on.
    for bad in [
        serde_json::json!(["not an object"]),
        serde_json::json!([{"role": "developer", "content": ""}]),
        serde_json::json!([{"role": "developer", "content": ["x"]}]),
        serde_json::json!([{"role": "function", "content": "x"}]),
        serde_json::json!([{"content": "x"}]),
        serde_json::json!([{"role": "user", "content": null}]),
        serde_json::json!([{"role": "user", "content": 5}]),
        serde_json::json!([{"role": "user", "content": "x", "task": "bogus"}]),
        serde_json::json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]),
        serde_json::json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]),
        serde_json::json!([{"role": "assistant", "tool_calls": "x"}]),
        serde_json::json!([{"role": "system", "tools": [{"type": "function"}]}]),
        serde_json::json!([{"role": "tool", "content": [1]}]),
    ] {
        assert!(
            encode_messages(bad.as_array().unwrap(), &opts).is_err(),
            "{bad}"
        );
    }
    assert!("auto".parse::<ThinkingMode>().is_err());
    assert!("low".parse::<ReasoningEffort>().is_err());
}

#[test]
fn chat_encode_python_str_of_non_string_values() {
    // Verified against the reference: non-string values are interpolated with Python's str().
    let opts = EncodeOptions::new(ThinkingMode::Chat);
    let msgs = serde_json::json!([
        {"role": "system", "content": {"a": "it's", "b": [1, 2.0, null, true]}},
        {"role": "latest_reminder"},
        {"role": "user", "content": "q"},
        {"role": "tool", "content": {"temp": 22, "s": "\u{200b}"}},
        {"role": "tool", "content": null},
        {"role": "tool", "content": [{"type": "text", "text": "A"}, {"type": "image"}, {"text": "n"}]},
        {"role": "assistant", "content": 1e20, "tool_calls": [{"function": {"name": null, "arguments": null}}]}
    ]);
    let out = encode_messages(msgs.as_array().unwrap(), &opts).unwrap();
    let want = "<｜begin▁of▁sentence｜>{'a': \"it's\", 'b': [1, 2.0, None, True]}<｜latest_reminder｜>None<｜User｜>q\n\n<tool_result>{'temp': 22, 's': '\\u200b'}</tool_result>\n\n<tool_result>None</tool_result>\n\n<tool_result>A\n\n[Unsupported image]\n\n[Unsupported None]</tool_result><｜Assistant｜></think>1e+20\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"None\">\n<｜DSML｜parameter name=\"arguments\" string=\"false\">null</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
    assert_eq!(out, want);
}
