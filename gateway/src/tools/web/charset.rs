//! web_fetch's text bodies: a response's bytes decoded to UTF-8 by the character encoding
//! the response declares, as a browser decodes them (the WHATWG Encoding Standard through
//! `encoding_rs`, Firefox's implementation; the standard's names and labels, so
//! `ISO-8859-1` and `us-ascii` read as `windows-1252`).
//!
//! The encoding, first found wins: a byte order mark; the `charset` of `Content-Type`; for
//! HTML, a `<meta charset>` or `<meta http-equiv="Content-Type" content="...; charset=...">`
//! in the first 1024 bytes (the standard's prescan, simplified: comments and other tags are
//! skipped, attributes parsed). A declaration that names no encoding is skipped (the next
//! one counts), and said so. The body must decode without an error in the encoding found;
//! if it does not (a lying declaration) or nothing was declared, it is read as UTF-8 when it
//! is valid UTF-8, and otherwise not read as text at all (web_fetch then sends base64), the
//! reason in the note. A body cut at the size cap may end inside a character: that
//! character is dropped, not an error.

use encoding_rs::{DecoderResult, Encoding, REPLACEMENT, UTF_8, UTF_16BE, UTF_16LE, WINDOWS_1252};
use schemars::JsonSchema;
use serde::Serialize;

/// How many bytes of an HTML page are searched for a `<meta>` charset (as browsers do).
pub const META_PRESCAN_BYTES: usize = 1024;

/// Where a body's encoding came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CharsetSource {
    /// A byte order mark at the start of the body.
    Bom,
    /// The `charset` parameter of the `Content-Type` header.
    ContentType,
    /// An HTML page's `<meta charset>` or `http-equiv` `Content-Type`.
    Meta,
    /// None declared or usable: UTF-8.
    Default,
}

impl CharsetSource {
    fn describe(self) -> &'static str {
        match self {
            CharsetSource::Bom => "its byte order mark",
            CharsetSource::ContentType => "Content-Type",
            CharsetSource::Meta => "the page's <meta>",
            CharsetSource::Default => "default",
        }
    }
}

/// A body decoded to UTF-8, or not text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The text and the encoding it was decoded from, or `None`: not text in any encoding
    /// tried.
    pub text: Option<(String, &'static Encoding)>,
    /// Where the encoding came from (with `text`).
    pub source: CharsetSource,
    /// Why a declared encoding was not used, and what was done instead.
    pub note: Option<String>,
}

/// Decodes `bytes`, a response body with the `Content-Type` `content_type`; `html` says
/// whether to look for a `<meta>` charset; `truncated`, that the body was cut.
pub fn decode(bytes: &[u8], content_type: &str, html: bool, truncated: bool) -> Decoded {
    let mut notes: Vec<String> = Vec::new();
    let mut found: Option<(&'static Encoding, CharsetSource, usize)> =
        Encoding::for_bom(bytes).map(|(e, len)| (e, CharsetSource::Bom, len));
    if found.is_none()
        && let Some(label) = content_type_charset(content_type)
    {
        match known(label) {
            Some(e) => found = Some((e, CharsetSource::ContentType, 0)),
            None => notes.push(unknown(label, CharsetSource::ContentType)),
        }
    }
    if found.is_none()
        && html
        && let Some(label) = meta_charset(&bytes[..bytes.len().min(META_PRESCAN_BYTES)])
    {
        match known(&label) {
            // The standard: a page cannot declare UTF-16 in itself (its bytes would not be
            // ASCII-compatible for the <meta> to be read); x-user-defined is windows-1252.
            Some(e) if e == UTF_16BE || e == UTF_16LE => {
                found = Some((UTF_8, CharsetSource::Meta, 0));
            }
            Some(e) if e.name() == "x-user-defined" => {
                found = Some((WINDOWS_1252, CharsetSource::Meta, 0));
            }
            Some(e) => found = Some((e, CharsetSource::Meta, 0)),
            None => notes.push(unknown(&label, CharsetSource::Meta)),
        }
    }
    if let Some((encoding, source, skip)) = found {
        match decode_as(encoding, &bytes[skip..], truncated) {
            Some(text) => {
                return Decoded {
                    text: Some((text, encoding)),
                    source,
                    note: join(notes),
                };
            }
            None => notes.push(format!(
                "the body is not valid {} (declared by {})",
                encoding.name(),
                source.describe()
            )),
        }
    }
    match decode_as(UTF_8, bytes, truncated) {
        Some(text) => {
            if !notes.is_empty() {
                notes.push("read as UTF-8, which it is".into());
            }
            Decoded {
                text: Some((text, UTF_8)),
                source: CharsetSource::Default,
                note: join(notes),
            }
        }
        None => {
            if !notes.is_empty() {
                notes.push("it is not UTF-8 either: the body is base64".into());
            }
            Decoded {
                text: None,
                source: CharsetSource::Default,
                note: join(notes),
            }
        }
    }
}

fn join(notes: Vec<String>) -> Option<String> {
    (!notes.is_empty()).then(|| notes.join("; "))
}

fn unknown(label: &str, source: CharsetSource) -> String {
    let shown: String = label.chars().take(64).collect();
    format!(
        "{} declares charset {shown:?}, which is not an encoding of the WHATWG Encoding \
         Standard",
        source.describe()
    )
}

/// The encoding of a label, unless it has none (or only the "replacement" encoding, which
/// decodes any body to one U+FFFD: the standard's guard for encodings it refuses).
fn known(label: &str) -> Option<&'static Encoding> {
    Encoding::for_label(label.as_bytes()).filter(|e| *e != REPLACEMENT)
}

/// `bytes` in `encoding` without the BOM, or `None` at the first malformed sequence (a
/// character cut by truncation at the end excepted).
fn decode_as(encoding: &'static Encoding, bytes: &[u8], truncated: bool) -> Option<String> {
    let mut decoder = encoding.new_decoder_without_bom_handling();
    let mut out = String::with_capacity(decoder.max_utf8_buffer_length(bytes.len())?);
    match decoder.decode_to_string_without_replacement(bytes, &mut out, !truncated) {
        (DecoderResult::InputEmpty, _) => Some(out),
        _ => None,
    }
}

/// The `charset` parameter of a `Content-Type` value, unquoted.
fn content_type_charset(content_type: &str) -> Option<&str> {
    content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches(['"', '\'']).trim())
            .filter(|v| !v.is_empty())
    })
}

/// The charset label a page's first `<meta>` declaring one gives: `charset="..."`, or
/// `http-equiv="content-type"` with `content="...; charset=..."`. Comments, other tags and
/// a tag cut at the end of `head` are skipped.
fn meta_charset(head: &[u8]) -> Option<String> {
    let lower = |i: usize| head.get(i).map(u8::to_ascii_lowercase);
    let starts = |i: usize, s: &[u8]| {
        head.len() >= i + s.len() && head[i..i + s.len()].eq_ignore_ascii_case(s)
    };
    let mut i = 0;
    while i < head.len() {
        if head[i] != b'<' {
            i += 1;
            continue;
        }
        if starts(i, b"<!--") {
            i = find(head, i + 4, b"-->")? + 3;
        } else if starts(i, b"<meta")
            && lower(i + 5).is_some_and(|c| c.is_ascii_whitespace() || c == b'/')
        {
            let (attrs, end) = attributes(head, i + 5)?;
            let get = |name: &str| attrs.iter().find(|(n, _)| n == name).map(|(_, v)| v);
            if let Some(c) = get("charset") {
                return Some(c.clone());
            }
            if get("http-equiv").is_some_and(|h| h.eq_ignore_ascii_case("content-type"))
                && let Some(c) = get("content").and_then(|c| charset_in_content(c))
            {
                return Some(c);
            }
            i = end;
        } else if lower(i + 1).is_some_and(|c| c.is_ascii_alphabetic())
            || (head.get(i + 1) == Some(&b'/')
                && lower(i + 2).is_some_and(|c| c.is_ascii_alphabetic()))
        {
            // Another tag: its attributes may hold a '>' in quotes.
            let start = i
                + 1
                + head[i + 1..]
                    .iter()
                    .position(|c| c.is_ascii_whitespace() || *c == b'>')?;
            i = attributes(head, start)?.1;
        } else if matches!(head.get(i + 1), Some(b'!' | b'/' | b'?')) {
            i = find(head, i + 1, b">")? + 1;
        } else {
            i += 1;
        }
    }
    None
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| from + p)
}

/// A tag's attributes from `i` (just after its name) to its `>`: (lowercase name, value)
/// pairs and the index after the `>`; `None` when the tag does not end within `b`.
fn attributes(b: &[u8], mut i: usize) -> Option<(Vec<(String, String)>, usize)> {
    let mut attrs = Vec::new();
    loop {
        while b
            .get(i)
            .is_some_and(|c| c.is_ascii_whitespace() || *c == b'/')
        {
            i += 1;
        }
        match b.get(i)? {
            b'>' => return Some((attrs, i + 1)),
            _ => {
                let start = i;
                while b
                    .get(i)
                    .is_some_and(|c| !c.is_ascii_whitespace() && !matches!(c, b'=' | b'>' | b'/'))
                {
                    i += 1;
                }
                let name = String::from_utf8_lossy(&b[start..i]).to_ascii_lowercase();
                while b.get(i).is_some_and(u8::is_ascii_whitespace) {
                    i += 1;
                }
                let mut value = String::new();
                if b.get(i) == Some(&b'=') {
                    i += 1;
                    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
                        i += 1;
                    }
                    let v = match *b.get(i)? {
                        q @ (b'"' | b'\'') => {
                            let end = i + 1 + b[i + 1..].iter().position(|c| *c == q)?;
                            let v = &b[i + 1..end];
                            i = end + 1;
                            v
                        }
                        _ => {
                            let start = i;
                            while b
                                .get(i)
                                .is_some_and(|c| !c.is_ascii_whitespace() && *c != b'>')
                            {
                                i += 1;
                            }
                            &b[start..i]
                        }
                    };
                    value = String::from_utf8_lossy(v).into_owned();
                }
                if !name.is_empty() && !attrs.iter().any(|(n, _)| *n == name) {
                    attrs.push((name, value));
                }
            }
        }
    }
}

/// The charset of a `<meta http-equiv>`'s `content` ("text/html; charset=Shift_JIS").
fn charset_in_content(content: &str) -> Option<String> {
    let lower = content.to_ascii_lowercase();
    let at = lower.find("charset")?;
    let rest = content[at + "charset".len()..].trim_start();
    let rest = rest.strip_prefix('=')?.trim_start();
    let value = match rest.chars().next()? {
        q @ ('"' | '\'') => &rest[1..1 + rest[1..].find(q)?],
        _ => rest
            .split(|c: char| c == ';' || c.is_ascii_whitespace())
            .next()?,
    };
    (!value.is_empty()).then(|| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use encoding_rs::{EUC_JP, SHIFT_JIS, WINDOWS_1251};

    fn text(d: &Decoded) -> (&str, &str) {
        let (t, e) = d.text.as_ref().expect("text");
        (t.as_str(), e.name())
    }

    #[test]
    fn declared_charsets_decode_and_lies_fall_back() {
        let d = decode(
            b"caf\xe9 \x80",
            "text/plain; charset=ISO-8859-1",
            false,
            false,
        );
        assert_eq!(text(&d), ("café €", "windows-1252"));
        assert_eq!((d.source, d.note), (CharsetSource::ContentType, None));
        let (sjis, _, _) = SHIFT_JIS.encode("日本語のテキスト");
        let d = decode(&sjis, "text/plain;charset=\"shift_jis\"", false, false);
        assert_eq!(text(&d), ("日本語のテキスト", "Shift_JIS"));
        // Cut inside its last character: that character is dropped.
        let d = decode(
            &sjis[..sjis.len() - 1],
            "text/plain; charset=sjis",
            false,
            true,
        );
        assert_eq!(text(&d), ("日本語のテキス", "Shift_JIS"));
        // A BOM wins over the header.
        let d = decode(
            b"\xef\xbb\xbfok \xc3\xa9",
            "text/plain; charset=windows-1252",
            false,
            false,
        );
        assert_eq!(text(&d), ("ok é", "UTF-8"));
        assert_eq!(d.source, CharsetSource::Bom);
        // A lying label: not valid ISO-2022-JP, but UTF-8.
        let d = decode(
            "naïve ✓".as_bytes(),
            "text/plain; charset=iso-2022-jp",
            false,
            false,
        );
        assert_eq!(text(&d), ("naïve ✓", "UTF-8"));
        assert_eq!(d.source, CharsetSource::Default);
        assert!(
            d.note.as_deref().unwrap().contains("not valid ISO-2022-JP"),
            "{d:?}"
        );
        // An unknown label, and bytes that are no text: base64, said so.
        let d = decode(b"\x81\xff", "text/plain; charset=x-klingon", false, false);
        assert_eq!(d.text, None);
        let note = d.note.unwrap();
        assert!(
            note.contains("\"x-klingon\"") && note.contains("base64"),
            "{note}"
        );
        // Nothing declared: UTF-8 or nothing, without a note (as before).
        assert_eq!(decode(b"plain", "text/plain", false, false).note, None);
        assert_eq!(
            decode(b"\x89P\xff\x00", "image/png", false, false).text,
            None
        );
    }

    #[test]
    fn html_meta_declarations_are_found_in_the_first_1024_bytes() {
        let page = |head: &str, body: &str, e: &'static Encoding| {
            let html = format!(
                "<!doctype html><html><head>{head}</head><body><p>{body}</p></body></html>"
            );
            e.encode(&html).0.into_owned()
        };
        for (head, want) in [
            (r#"<meta charset="windows-1251">"#, WINDOWS_1251),
            (r#"<META CHARSET=windows-1251 />"#, WINDOWS_1251),
            (
                r#"<meta http-equiv="Content-Type" content="text/html; charset=EUC-JP">"#,
                EUC_JP,
            ),
            (
                r#"<meta content='text/html;charset="euc-jp"' http-equiv=content-type>"#,
                EUC_JP,
            ),
            (
                r#"<!-- <meta charset="koi8-r"> --><title a=">">x</title><meta charset=shift_jis>"#,
                SHIFT_JIS,
            ),
        ] {
            let words = if want == WINDOWS_1251 {
                "Привет, мир"
            } else {
                "日本語"
            };
            let d = decode(&page(head, words, want), "text/html", true, false);
            let (t, name) = text(&d);
            assert_eq!(name, want.name(), "{head}");
            assert!(t.contains(words), "{head}: {t}");
            assert_eq!(d.source, CharsetSource::Meta, "{head}");
        }
        // The header wins over the page; past 1024 bytes a <meta> is not looked for.
        let html = page(r#"<meta charset="shift_jis">"#, "café", WINDOWS_1252);
        let d = decode(&html, "text/html; charset=windows-1252", true, false);
        assert_eq!(
            (text(&d).1, d.source),
            ("windows-1252", CharsetSource::ContentType)
        );
        let late = format!(
            "<html><!-- {} --><meta charset=windows-1251>",
            "x".repeat(1024)
        );
        let d = decode(late.as_bytes(), "text/html", true, false);
        assert_eq!((text(&d).1, d.source), ("UTF-8", CharsetSource::Default));
        // Not HTML: no <meta> sniffing.
        let d = decode(
            &page(r#"<meta charset="windows-1251">"#, "x", WINDOWS_1251),
            "text/plain",
            false,
            false,
        );
        assert_eq!(d.source, CharsetSource::Default);
        // A page declaring UTF-16 in itself is read as UTF-8 (the standard's rule).
        let d = decode(
            b"<meta charset=utf-16le><p>ok</p>",
            "text/html",
            true,
            false,
        );
        assert_eq!((text(&d).1, d.source), ("UTF-8", CharsetSource::Meta));
        // Tags cut at the end of the window, unterminated comments: no answer, no panic.
        for head in [
            "<meta charset=\"windows-1251",
            "<!-- <meta charset=x>",
            "<meta",
            "<",
            "<a b='>",
        ] {
            assert_eq!(meta_charset(head.as_bytes()), None, "{head}");
        }
    }
}
