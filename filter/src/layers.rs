//! Keeps the layer list in `lib.rs`'s doc comment true: every module of the crate
//! belongs to one of its layers, and none imports (`crate::...`) from its own layer
//! or one above. The list is read from `lib.rs` itself, so the documented table is
//! the one checked. Test code is left out (a test may build whatever it needs), and
//! so are comments and string literals. Native only: it reads the source files.

use std::fs;
use std::path::{Path, PathBuf};

/// The layers as `lib.rs` documents them: each numbered item's module paths (the
/// backticked names outside parentheses), lowest first.
fn documented_layers(lib: &str) -> Vec<Vec<String>> {
    let mut layers: Vec<String> = Vec::new();
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        let numbered = doc
            .split_once(". ")
            .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        match numbered {
            Some((_, rest)) => layers.push(rest.to_string()),
            None if doc.is_empty() => {
                if let Some(last) = layers.last_mut() {
                    last.push('\n');
                }
            }
            None => {
                if let Some(last) = layers.last_mut().filter(|l| !l.ends_with('\n')) {
                    last.push(' ');
                    last.push_str(doc);
                }
            }
        }
    }
    layers.iter().map(|item| module_names(item)).collect()
}

/// The backticked module paths of one list item, outside its parentheses.
fn module_names(item: &str) -> Vec<String> {
    let mut depth = 0usize;
    let mut outside = String::new();
    for c in item.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    outside
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| {
            !name.is_empty()
                && name.split("::").all(|part| {
                    !part.is_empty()
                        && part
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                })
        })
        .map(str::to_string)
        .collect()
}

/// `text` without comments, and with string and char literals emptied.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |j: usize| j > 0 && (b[j - 1].is_ascii_alphanumeric() || b[j - 1] == b'_');
    while i < b.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |j| j + 2);
        } else if let Some(hashes) = raw_string_start(rest).filter(|_| !ident(i)) {
            let open = rest.find('"').unwrap() + 1;
            let close = format!("\"{}", "#".repeat(hashes));
            i += open + rest[open..].find(&close).unwrap() + close.len();
            out.push_str("\"\"");
        } else if rest.starts_with('"') || (rest.starts_with("b\"") && !ident(i)) {
            let mut j = i + rest.find('"').unwrap() + 1;
            while b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            out.push_str("\"\"");
        } else if let Some(len) = char_literal(rest) {
            i += len;
            out.push_str("' '");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The number of `#`s of a raw string literal starting `s` (`r#"`, `br"`).
fn raw_string_start(s: &str) -> Option<usize> {
    let s = s.strip_prefix('b').unwrap_or(s).strip_prefix('r')?;
    let hashes = s.len() - s.trim_start_matches('#').len();
    s[hashes..].starts_with('"').then_some(hashes)
}

/// The length of a char literal starting `s` (not a lifetime).
fn char_literal(s: &str) -> Option<usize> {
    let mut chars = s.char_indices().skip(1);
    let (_, c) = chars.next()?;
    if !s.starts_with('\'') {
        return None;
    }
    if c == '\\' {
        return s[1..].find('\'').map(|j| {
            // `'\''`: the quote escaped is not the end.
            if s[1..].starts_with("\\'") {
                j + 3
            } else {
                j + 2
            }
        });
    }
    let (j, close) = chars.next()?;
    (close == '\'').then_some(j + 1)
}

/// `code` without the items under `#[cfg(test)]`.
fn without_tests(mut code: String) -> String {
    const ATTR: &str = "#[cfg(test)]";
    while let Some(at) = code.find(ATTR) {
        let after = at + ATTR.len();
        let brace = code[after..].find('{').map(|j| after + j);
        let semi = code[after..].find(';').map(|j| after + j);
        let end = match (brace, semi) {
            (_, Some(s)) if brace.is_none_or(|b| s < b) => s + 1,
            (Some(open), _) => {
                let mut depth = 0;
                let mut end = code.len();
                for (j, c) in code[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = open + j + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            _ => code.len(),
        };
        code.replace_range(at..end, "");
    }
    code
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The module path of a source file relative to `src` (`request/router/mod.rs`:
/// `request::router`).
fn module_path(relative: &Path) -> String {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The layer of the listed module `path` is, or lies in.
fn layer_of<'l>(path: &str, units: &'l [(String, usize)]) -> Option<&'l (String, usize)> {
    units
        .iter()
        .filter(|(unit, _)| path == unit || path.starts_with(&format!("{unit}::")))
        .max_by_key(|(unit, _)| unit.len())
}

#[test]
fn no_module_imports_from_its_own_layer_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers = documented_layers(&fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(layers.len() > 3, "lib.rs lists its layers: {layers:?}");
    let units: Vec<(String, usize)> = layers
        .iter()
        .enumerate()
        .flat_map(|(n, names)| names.iter().map(move |m| (m.clone(), n + 1)))
        .collect();
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let module = module_path(relative);
        // The crate root and this test stand outside the layers.
        if module == "lib" || module == "layers" {
            continue;
        }
        let Some((unit, layer)) = layer_of(&module, &units) else {
            // A folder that groups listed modules declares them and nothing else.
            let groups = units
                .iter()
                .any(|(u, _)| u.starts_with(&format!("{module}::")));
            assert!(
                groups,
                "{} belongs to no layer of lib.rs's list",
                relative.display()
            );
            continue;
        };
        let code = without_tests(code_only(&fs::read_to_string(&file).unwrap()));
        for (at, _) in code.match_indices("crate::") {
            let path: String = code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let path = path.trim_end_matches(':');
            match layer_of(path, &units) {
                Some((used, used_layer)) if used != unit && used_layer >= layer => {
                    wrong.push(format!(
                        "{} (`{unit}`, layer {layer}) imports crate::{path} (`{used}`, layer {used_layer})",
                        relative.display()
                    ))
                }
                _ => {}
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against lib.rs's layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checker_reads_what_it_should() {
    let lib = "//! Text.\n//!\n//! 1. `a` (the `b` inside), `c::d`;\n//!    `e`, then `f`.\n//! 2. `g`.\n//!\n//! `h` is not a layer.\n";
    assert_eq!(
        documented_layers(lib),
        [vec!["a", "c::d", "e", "f"], vec!["g"]]
    );
    let code = "use crate::a; // crate::b\n/* crate::c */ let s = \"crate::d\"; let r = r#\"crate::e\"#; let q = '\"'; let l: &'static str;\n#[cfg(test)]\nmod tests { use crate::f; }\nuse crate::g;";
    let kept = without_tests(code_only(code));
    let used: Vec<&str> = kept
        .match_indices("crate::")
        .map(|(i, _)| &kept[i + 7..i + 8])
        .collect();
    assert_eq!(used, ["a", "g"]);
}
