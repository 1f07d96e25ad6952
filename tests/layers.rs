//! The crate's layering, checked: each module of the engine refers only to modules below it,
//! the shipped programs only to the engine's public paths, and the lab only to what is below
//! it. A reference is a `crate::module` path in code (comments and doc links are not
//! dependencies); a new reference that climbs a layer, and so could close a cycle, fails here
//! with the line that makes it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The modules, lowest layer first. A module may refer to modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    &["error", "isa", "sync", "rng"],
    &[
        "duration", "limits", "wire", "packet", "fpisa", "fabric", "pipeline",
    ],
    &["mem", "timer"],
    &["program"],
    &["ada", "pfe"],
    &["microcode"],
    &[
        "lab::aggregation",
        "lab::bench",
        "lab::control",
        "lab::ports",
        "lab::trace",
        "lab::udp_batch",
    ],
    &["lab::replay", "lab::serve"],
    &["lab::live"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file of `src/` belongs to, as `LAYERS` names it (`None`: the crate root, the
/// lab's root or the binary).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("a file under src");
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    match parts[0].as_str() {
        "lib" | "bin" => None,
        "lab" if parts[1] == "mod" => None,
        "lab" => Some(format!("lab::{}", parts[1])),
        m => Some(m.to_string()),
    }
}

/// The code of a line: nothing of a comment line, and the part before a `//` comment.
fn code_of(line: &str) -> &str {
    let t = line.trim_start();
    if t.starts_with("//") {
        return "";
    }
    match line.find("// ") {
        Some(i) if !line[..i].contains('"') => &line[..i],
        _ => line,
    }
}

/// The modules a line of code names as `{prefix}module` (`lab::x` for the lab's).
fn referenced(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if name == "lab" && rest[3..].starts_with("::") {
            let sub: String = rest[5..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            out.push(format!("lab::{sub}"));
        } else if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

#[test]
fn every_module_refers_only_to_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut climbs = Vec::new();
    let mut seen = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let own = layer_of(&module)
            .unwrap_or_else(|| panic!("{} is in no layer of LAYERS: add it", file.display()));
        *seen.entry(module.clone()).or_insert(0) += 1;
        let text = fs::read_to_string(file).expect("a source file");
        for (n, line) in text.lines().enumerate() {
            for target in referenced(code_of(line), "crate::") {
                if target == module {
                    continue;
                }
                // Macro helpers of `wire` (`crate::__header_field_type`) and the like.
                let Some(layer) = layer_of(&target) else {
                    continue;
                };
                if layer >= own {
                    climbs.push(format!(
                        "{}:{}: {module} refers to {target}: {}",
                        file.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(seen.len() > 10, "found too few modules: {seen:?}");
    assert!(
        climbs.is_empty(),
        "references that climb a layer:\n{}",
        climbs.join("\n")
    );
}

/// The shipped programs name the engine as `pfemu::...`, as a user's crate does, and never
/// the lab; each other as `crate::microcode::...`. (`microcode/Cargo.toml` compiles them
/// against the engine alone; this says which line is wrong when that build fails.)
#[test]
fn the_shipped_programs_use_the_engines_public_paths_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("microcode"), &mut files);
    assert!(files.len() >= 8, "found too few programs: {files:?}");
    let mut wrong = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("a source file");
        for (n, line) in text.lines().enumerate() {
            let code = code_of(line);
            let bad = referenced(code, "crate::")
                .into_iter()
                .any(|m| m != "microcode")
                || referenced(code, "pfemu::")
                    .iter()
                    .any(|m| m.starts_with("lab::") || m == "lab");
            if bad {
                wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "lines that reach past the engine's public API:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reference_finder_finds_what_it_must() {
    assert_eq!(referenced("use crate::mem::{Addr};", "crate::"), ["mem"]);
    assert_eq!(
        referenced("x(crate::lab::serve::Server, crate::rng::mix)", "crate::"),
        ["lab::serve", "rng"]
    );
    assert!(referenced("$crate::wire::x; my_crate::mem", "crate::").is_empty());
    assert_eq!(code_of("    /// see [`crate::pfe`]"), "");
    assert_eq!(
        code_of("let a = crate::mem::X; // crate::pfe"),
        "let a = crate::mem::X; "
    );
}
