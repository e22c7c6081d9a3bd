//! End-to-end tests of the `flashseek` binary on the embedded default model and the goldens.

use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flashseek"))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cache: &std::path::Path, args: &[&str]) -> Output {
    bin().env("FLASHSEEK_CACHE", cache).args(args).output().expect("binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn chat_and_generate_on_the_embedded_model() {
    let cache = tempfile::tempdir().unwrap();
    // First run writes the default model, says it is random, answers, and prints the stats line.
    let a = run(cache.path(), &["chat", "-m", "Hello!", "--max-tokens", "12", "--seed", "7"]);
    let err = text(&a.stderr);
    assert!(a.status.success(), "chat failed: {err}");
    assert!(err.contains("wrote the embedded default model"), "{err}");
    assert!(err.contains("meaningless") && err.contains("--model"), "{err}");
    assert!(err.contains("prefill") && err.contains("decode") && err.contains("tok/s"), "{err}");
    assert!(!text(&a.stdout).trim().is_empty(), "no answer printed");
    // Second run reuses the cached model and, with the same seed, prints the same answer.
    let b = run(cache.path(), &["chat", "-m", "Hello!", "--max-tokens", "12", "--seed", "7"]);
    assert!(b.status.success());
    assert!(!text(&b.stderr).contains("wrote the embedded default model"));
    assert_eq!(text(&a.stdout), text(&b.stdout), "same seed, same tokens");
    // The REPL takes several turns from stdin.
    let mut child = bin()
        .env("FLASHSEEK_CACHE", cache.path())
        .args(["chat", "--think", "--max-tokens", "6", "--temperature", "0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"first\nsecond\n/exit\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("tok/s ·").count() / 2, 2, "two answers with stats: {err}");
    // Greedy raw-text generation is deterministic.
    let g1 = run(cache.path(), &["generate", "--prompt", "Once upon a time", "--max-tokens", "10", "--temperature", "0"]);
    let g2 = run(cache.path(), &["generate", "--prompt", "Once upon a time", "--max-tokens", "10", "--temperature", "0"]);
    assert!(g1.status.success(), "{}", text(&g1.stderr));
    assert!(text(&g1.stdout).starts_with("Once upon a time"));
    assert_eq!(g1.stdout, g2.stdout);
}

#[test]
fn bad_flags_are_clear_errors() {
    let cache = tempfile::tempdir().unwrap();
    // Invalid argument values exit 2, like clap's own argument errors.
    let o = run(cache.path(), &["generate", "--prompt", "x", "--temperature", "-1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("temperature"), "{}", text(&o.stderr));
    let o = run(cache.path(), &["generate", "--prompt", "x", "--device", "tpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--device tpu"), "{}", text(&o.stderr));
    let o = run(cache.path(), &["generate", "--prompt", "x", "--max-tokens", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("must be at least 1"), "{}", text(&o.stderr));
    // The GPU commands' and serve's argument errors too (checked before any GPU is opened).
    for args in [&["gpu-bench", "--chunk", "0"][..], &["qualify", "--chunk", "0"], &["gpu-check", "--repeats", "0"], &["gpu-bench", "--layers", "50"], &["serve", "--max-queue", "0"], &["serve", "--max-body-bytes", "0"]] {
        let o = run(cache.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        assert!(text(&o.stderr).starts_with("error: --"), "{args:?}: {}", text(&o.stderr));
    }
    // Without a GPU (CI), the CUDA backend fails with a clear error, not a panic.
    let o = run(cache.path(), &["generate", "--prompt", "x", "--device", "cuda", "--max-tokens", "2"]);
    if !o.status.success() {
        assert_eq!(o.status.code(), Some(1));
        let err = text(&o.stderr);
        assert!(err.contains("CUDA") && !err.contains("panicked") && err.len() < 2000, "{err}");
    }
    let o = run(cache.path(), &["chat", "-m", "x", "--model", "/definitely/not/here"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("/definitely/not/here"), "{}", text(&o.stderr));
}

#[test]
fn logits_command_matches_the_golden() {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.json");
    std::fs::write(&ids, "[0, 5, 17, 300, 2]").unwrap();
    let out = dir.path().join("logits.safetensors");
    let model = repo().join("tests/fixtures/goldens/tiny_flash_rates/model");
    let o = bin()
        .args(["logits", "--model"])
        .arg(&model)
        .arg("--ids")
        .arg(&ids)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.shape(), &[5, 512]);
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    // A bad ids file is rejected with the file named.
    std::fs::write(&ids, "[0, -3]").unwrap();
    let o = bin().args(["logits", "--model"]).arg(&model).arg("--ids").arg(&ids).arg("--out").arg(&out).output().unwrap();
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("ids.json"), "{}", text(&o.stderr));
}

/// `switches` prints one line per switch (value, default, origin) and `--verbose` what each replaces.
#[test]
fn switches_table_lists_every_switch() {
    let cache = tempfile::tempdir().unwrap();
    let json = run(cache.path(), &["switches", "--json"]);
    assert!(json.status.success());
    let rows: serde_json::Value = serde_json::from_slice(&json.stdout).expect("switches --json is JSON");
    let names: Vec<String> = rows.as_array().expect("an array").iter().map(|r| r["name"].as_str().expect("a name").to_string()).collect();
    assert!(names.len() > 10, "{names:?}");
    let table = bin().env("FLASHSEEK_CACHE", cache.path()).env("FLASHSEEK_MLA_BF16", "on").args(["switches"]).output().expect("binary runs");
    assert!(table.status.success());
    let out = text(&table.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("switch") && lines[0].contains("default"), "{out}");
    for (line, name) in lines[1..=names.len()].iter().zip(&names) {
        assert!(line.starts_with(&format!("{name} ")), "{line} / {name}");
    }
    let bf16 = lines.iter().find(|l| l.starts_with("MLA_BF16 ")).expect("MLA_BF16 listed");
    let cols: Vec<&str> = bf16.split_whitespace().collect();
    assert_eq!(&cols[1..4], &["on", "off", "env"], "{bf16}");
    assert!(!out.contains("replaces:"), "{out}");
    let verbose = run(cache.path(), &["switches", "--verbose"]);
    assert!(verbose.status.success());
    let v = text(&verbose.stdout);
    assert_eq!(v.matches("replaces:").count(), names.len(), "{v}");
}
