//! Output normalisation: RFC 8785 canonical JSON and its BLAKE3 hash.

use serde_json::Value;

/// RFC 8785 (JCS) canonical JSON text of `value`.
pub fn canonical_json(value: &Value) -> String {
    // JCS fails only on non-finite numbers, which serde_json::Value cannot hold.
    serde_json_canonicalizer::to_string(value)
        .expect("serde_json values are always canonicalisable")
}

/// Lowercase hex BLAKE3 of `bytes`.
pub fn blake3_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Canonical JSON of `value` and the lowercase hex BLAKE3 of that text.
pub fn canonical_with_hash(value: &Value) -> (String, String) {
    let text = canonical_json(value);
    let hash = blake3_hex(text.as_bytes());
    (text, hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_and_whitespace_removed() {
        let v = json!({"b": 1, "a": [true, null, "x"], "c": {"z": 1.0, "y": 1e21}});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":[true,null,"x"],"b":1,"c":{"y":1e+21,"z":1}}"#
        );
    }

    #[test]
    fn hash_is_of_canonical_text() {
        let (text, hash) = canonical_with_hash(&json!({"b": 2, "a": 1}));
        assert_eq!(text, r#"{"a":1,"b":2}"#);
        assert_eq!(hash, blake3::hash(br#"{"a":1,"b":2}"#).to_hex().to_string());
        assert_eq!(hash.len(), 64);
        assert!(
            hash.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }
}
