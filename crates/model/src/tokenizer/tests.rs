//! Tests against the reference fixtures in the repository's sibling `shared/` folder
//! (`shared/fixtures/tokenizer_v4*.json*`, produced by Hugging Face `tokenizers` 0.23.3 in Python).

use std::path::PathBuf;

use serde_json::Value;

use super::*;

fn shared_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
}

fn read_shared(rel: &str) -> Vec<u8> {
    let path = shared_dir().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {} missing: {e}", path.display()))
}

fn tok() -> &'static Ds4Tokenizer {
    Ds4Tokenizer::shared().expect("embedded tokenizer loads")
}

struct Case {
    id: String,
    category: String,
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

fn cases() -> Vec<Case> {
    let raw = read_shared("fixtures/tokenizer_v4.jsonl");
    let text = String::from_utf8(raw).expect("fixture is UTF-8");
    let cases: Vec<Case> = text
        .split('\n')
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("fixture line is JSON");
            Case {
                id: v["id"].as_str().unwrap().to_owned(),
                category: v["category"].as_str().unwrap().to_owned(),
                text: v["text"].as_str().unwrap().to_owned(),
                ids: v["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
                    .collect(),
                decoded: v["decoded"].as_str().unwrap().to_owned(),
            }
        })
        .collect();
    assert_eq!(cases.len(), 238, "tokenizer_v4.jsonl has 238 cases");
    cases
}

/// Decode through the streaming decoder, one id at a time; also reports whether any push had to
/// hold bytes back.
fn stream_decode(t: &Ds4Tokenizer, ids: &[u32], skip_special: bool) -> (String, bool) {
    let mut dec = StreamDecoder::new(t, skip_special);
    let mut out = String::new();
    let mut held = false;
    for &id in ids {
        out.push_str(&dec.push(id).expect("known id"));
        held |= dec.has_pending();
    }
    out.push_str(&dec.finish());
    assert!(!dec.has_pending());
    (out, held)
}

/// Id of the byte-level token standing for one raw byte.
fn byte_id(t: &Ds4Tokenizer, b: u8) -> u32 {
    let c = (0..324u32)
        .filter_map(char::from_u32)
        .find(|&c| byte_level_byte(c) == Some(b))
        .unwrap();
    t.token_to_id(&c.to_string())
        .unwrap_or_else(|| panic!("no token for byte {b:#04x}"))
}

#[test]
fn tokenizer_embedded_asset_is_the_shared_tokenizer_json() {
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(EMBEDDED_TOKENIZER_GZ)
        .read_to_end(&mut json)
        .unwrap();
    assert_eq!(json.len(), 6_367_146);
    assert!(
        json == read_shared("tokenizer/tokenizer.json"),
        "asset differs from shared/tokenizer/tokenizer.json"
    );
}

#[test]
fn tokenizer_basic_facts() {
    let t = tok();
    assert_eq!(t.vocab_size(), 129_280);
    assert_eq!(t.bos_id(), 0);
    assert_eq!(t.eos_id(), 1);
    for (s, id) in [
        ("<｜User｜>", 128_803),
        ("<｜Assistant｜>", 128_804),
        ("<think>", 128_821),
        ("</think>", 128_822),
        ("｜DSML｜", 128_825),
        ("<｜latest_reminder｜>", 128_828),
    ] {
        assert_eq!(t.token_to_id(s), Some(id), "{s}");
        assert_eq!(t.id_to_token(id).as_deref(), Some(s));
    }
    assert_eq!(t.id_to_token(19923).as_deref(), Some("Hello"));
    assert_eq!(t.id_to_token(129_280), None);
    assert_eq!(t.token_to_id("<|User|>"), None);
    assert!(t.is_special(0) && t.is_special(1));
    assert!(!t.is_special(128_803) && !t.is_special(19923) && !t.is_special(u32::MAX));
    // Every id below vocab_size has a token.
    assert!((0..129_280u32).all(|id| t.id_to_token(id).is_some()));
    let _ = format!("{t:?}");
}

#[test]
fn tokenizer_fixture_cases_encode_and_decode_exactly() {
    let t = tok();
    let cases = cases();
    let mut failures = Vec::new();
    for c in &cases {
        let ids = t.encode_with_special(&c.text).unwrap();
        if ids != c.ids {
            failures.push(format!(
                "{} ({}): encode {:?} != {:?}",
                c.id, c.category, ids, c.ids
            ));
        }
        let decoded = t.decode(&c.ids, false).unwrap();
        if decoded != c.decoded {
            failures.push(format!(
                "{} ({}): decode {decoded:?} != {:?}",
                c.id, c.category, c.decoded
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixture cases fail:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn tokenizer_from_file_matches_embedded() {
    let t = Ds4Tokenizer::from_file(&shared_dir().join("tokenizer/tokenizer.json")).unwrap();
    assert_eq!(t.vocab_size(), tok().vocab_size());
    for c in cases().iter().step_by(7) {
        assert_eq!(t.encode_with_special(&c.text).unwrap(), c.ids, "{}", c.id);
    }
}

#[test]
fn tokenizer_every_added_token_maps_to_its_id() {
    let t = tok();
    let v: Value =
        serde_json::from_slice(&read_shared("fixtures/tokenizer_v4_special.json")).unwrap();
    let added = v["added_tokens"].as_object().unwrap();
    assert_eq!(added.len(), 1283);
    assert_eq!(v["added_tokens_count"].as_u64(), Some(1283));
    let special_false: Vec<&str> = v["special_false"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(special_false.len(), 53);
    for (content, id) in added {
        let id = u32::try_from(id.as_u64().unwrap()).unwrap();
        assert_eq!(t.token_to_id(content), Some(id), "{content}");
        assert_eq!(t.id_to_token(id).as_deref(), Some(content.as_str()));
        // Recognised as one token inside text, special or not.
        assert_eq!(
            t.encode_with_special(&format!("a{content}b")).unwrap()[1],
            id,
            "{content}"
        );
        assert_eq!(
            t.is_special(id),
            !special_false.contains(&content.as_str()),
            "{content}"
        );
        let skipped = t.decode(&[id], true).unwrap();
        assert_eq!(skipped.is_empty(), t.is_special(id), "{content}");
    }
    for (key, id) in [
        ("bos_token", t.bos_id()),
        ("eos_token", t.eos_id()),
        ("pad_token", t.eos_id()),
    ] {
        assert_eq!(t.token_to_id(v[key].as_str().unwrap()), Some(id), "{key}");
    }
}

#[test]
fn tokenizer_stream_decoder_matches_full_decode_on_fixtures() {
    let t = tok();
    let mut held_back_cases = 0;
    for c in &cases() {
        for skip in [false, true] {
            let (streamed, held) = stream_decode(t, &c.ids, skip);
            assert_eq!(
                streamed,
                t.decode(&c.ids, skip).unwrap(),
                "{} skip={skip}",
                c.id
            );
            if !skip {
                assert_eq!(streamed, c.decoded, "{}", c.id);
                held_back_cases += usize::from(held);
            }
        }
    }
    // Emoji/CJK cases split characters across tokens, so the hold-back path is exercised.
    assert!(
        held_back_cases >= 5,
        "only {held_back_cases} cases held bytes back"
    );
}

#[test]
fn tokenizer_stream_decoder_matches_full_decode_per_id() {
    let t = tok();
    let mut buf = Vec::new();
    for id in 0..t.vocab_size() as u32 {
        let (streamed, _) = stream_decode(t, &[id], false);
        assert_eq!(streamed, t.decode(&[id], false).unwrap(), "id {id}");
        buf.clear();
        t.token_bytes(id, &mut buf).unwrap();
        assert!(!buf.is_empty(), "id {id}");
    }
}

#[test]
fn tokenizer_stream_decoder_invalid_and_split_utf8() {
    let t = tok();
    let b = |x: u8| byte_id(t, x);
    let emoji = [b(0xF0), b(0x9F), b(0x98), b(0x80)]; // U+1F600
    let bos = t.bos_id();
    let user = t.token_to_id("<｜User｜>").unwrap();
    let seqs: Vec<Vec<u32>> = vec![
        emoji.to_vec(),
        emoji[..2].to_vec(),                               // truncated at the end
        vec![emoji[0], emoji[1], b(b'a'), emoji[2]],       // broken by ASCII
        vec![b(0x80), b(0xBF), b(0xFF), b(0xC0), b(0xAF)], // never valid
        vec![emoji[0], emoji[1], bos, emoji[2], emoji[3]], // special token inside a character
        vec![emoji[0], user, emoji[1], emoji[2], emoji[3]], // non-special added token inside
        vec![b(0xE4), b(0xBD), b(0xA0), b(0xED), b(0xA0), b(0x80)], // 你 + surrogate encoding
        vec![],
    ];
    for ids in &seqs {
        for skip in [false, true] {
            let (streamed, _) = stream_decode(t, ids, skip);
            assert_eq!(
                streamed,
                t.decode(ids, skip).unwrap(),
                "{ids:?} skip={skip}"
            );
        }
    }
    assert_eq!(t.decode(&emoji, false).unwrap(), "😀");
    assert_eq!(stream_decode(t, &seqs[4], true).0, "😀");

    // Pieces arrive as soon as complete.
    let mut dec = StreamDecoder::new(t, false);
    assert_eq!(dec.push(emoji[0]).unwrap(), "");
    assert_eq!(dec.push(emoji[1]).unwrap(), "");
    assert_eq!(dec.push(emoji[2]).unwrap(), "");
    assert_eq!(dec.push(emoji[3]).unwrap(), "😀");
    assert_eq!(dec.push(b(b'x')).unwrap(), "x");
    assert_eq!(dec.finish(), "");

    // Deterministic fuzz over byte tokens, specials and ordinary tokens.
    let pool: Vec<u32> = (0..=255u8)
        .map(b)
        .chain([bos, t.eos_id(), user, 19923, 2058, 128_821])
        .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let len = (state >> 59) as usize;
        let ids: Vec<u32> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                pool[(state % pool.len() as u64) as usize]
            })
            .collect();
        for skip in [false, true] {
            assert_eq!(
                stream_decode(t, &ids, skip).0,
                t.decode(&ids, skip).unwrap(),
                "{ids:?}"
            );
        }
    }
}

#[test]
fn tokenizer_encode_text_never_produces_added_tokens() {
    let t = tok();
    let text = "<｜User｜>";
    let ids = t.encode_text(text).unwrap();
    assert!(!ids.contains(&128_803), "{ids:?}");
    assert!(ids.len() > 1);
    assert_eq!(t.decode(&ids, false).unwrap(), text);
    assert_eq!(t.encode_with_special(text).unwrap(), vec![128_803]);

    let text =
        "hi<｜begin▁of▁sentence｜><think>x</think><｜end▁of▁sentence｜>｜DSML｜<｜Assistant｜>";
    let ids = t.encode_text(text).unwrap();
    assert!(
        ids.iter().all(|&id| id < 128_000 && !t.is_special(id)),
        "{ids:?}"
    );
    assert_eq!(t.decode(&ids, false).unwrap(), text);
    assert_eq!(
        t.decode(&ids, true).unwrap(),
        text,
        "nothing special to skip"
    );
    assert!(t.encode_text("").unwrap().is_empty());
    assert!(t.encode_with_special("").unwrap().is_empty());
}

#[test]
fn tokenizer_encode_text_equals_reference_without_added_tokens() {
    // The reference for `encode_text`: the same tokenizer.json with its added-token list emptied,
    // encoded by the library's own pipeline.
    let mut json: Value = serde_json::from_slice(&read_shared("tokenizer/tokenizer.json")).unwrap();
    json["added_tokens"] = Value::Array(Vec::new());
    let plain = Tokenizer::from_bytes(serde_json::to_vec(&json).unwrap()).unwrap();
    let t = tok();
    let mut without_added = 0;
    for c in &cases() {
        let ids = t.encode_text(&c.text).unwrap();
        let reference = plain.encode_fast(c.text.as_str(), false).unwrap();
        assert_eq!(ids, reference.get_ids(), "{}", c.id);
        assert_eq!(t.decode(&ids, false).unwrap(), c.text, "{}", c.id);
        if !c.ids.iter().any(|&id| id >= 128_000 || id <= 2) {
            assert_eq!(ids, c.ids, "{}: no added token, both encoders agree", c.id);
            without_added += 1;
        }
    }
    assert!(without_added > 150, "{without_added}");
}

#[test]
fn tokenizer_errors_are_reported_not_panicked() {
    let t = tok();
    for bad in [129_280u32, 200_000, u32::MAX] {
        assert!(matches!(
            t.decode(&[19923, bad], false),
            Err(TokenizerError::UnknownId { id, vocab_size: 129_280 }) if id == bad
        ));
        assert!(t.decode(&[bad], true).is_err());
        let mut dec = StreamDecoder::new(t, true);
        assert_eq!(dec.push(byte_id(t, 0xF0)).unwrap(), "");
        assert!(matches!(
            dec.push(bad),
            Err(TokenizerError::UnknownId { .. })
        ));
        assert!(dec.has_pending(), "failed push leaves the state alone");
        assert_eq!(dec.finish(), "\u{FFFD}");
    }

    let missing = shared_dir().join("tokenizer/does-not-exist.json");
    assert!(matches!(
        Ds4Tokenizer::from_file(&missing),
        Err(TokenizerError::Io { .. })
    ));
    assert!(matches!(
        Ds4Tokenizer::from_bytes(b"{not json"),
        Err(TokenizerError::Parse(_))
    ));
    assert!(matches!(
        Ds4Tokenizer::from_bytes(b""),
        Err(TokenizerError::Parse(_))
    ));

    let mut json: Value = serde_json::from_slice(&read_shared("tokenizer/tokenizer.json")).unwrap();
    json["decoder"] = Value::Null;
    let err = Ds4Tokenizer::from_bytes(&serde_json::to_vec(&json).unwrap()).unwrap_err();
    assert!(matches!(err, TokenizerError::Unsupported(_)), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, b"[1, 2, 3]").unwrap();
    assert!(matches!(
        Ds4Tokenizer::from_file(&path),
        Err(TokenizerError::Parse(_))
    ));
}
