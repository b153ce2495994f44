//! The API keys file: which key belongs to which tenant, stored as hashes only.
//!
//! ```yaml
//! keys:
//! - tenant: team-a
//!   sha256: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
//!   name: ci            # optional label, for `toolrun keys revoke`
//!   created: 2026-11-24T01:00:00Z
//! ```
//!
//! Keys are random and high-entropy (`toolrun keys create`: 256 bits; the chart: 40
//! alphanumerics, ~238 bits), so a fast unsalted hash is enough: nobody can search that
//! space, and a stolen file yields no key. SHA-256 rather than a slow password hash
//! (argon2 is for low-entropy secrets and would cost every request milliseconds) or
//! BLAKE3: Helm's `sha256sum` and the `sha256sum` tool compute it too, so the chart can
//! write a keys file for the key it generates. A presented key's hash is compared with
//! every stored hash in constant time (no early exit on the first differing byte).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::config::valid_tenant_name;

/// Prefix of keys made by `toolrun keys create` (easy to spot in a leaked log or repo).
pub const KEY_PREFIX: &str = "trk_";

/// Shortest and longest key accepted on the wire.
const KEY_LEN: std::ops::RangeInclusive<usize> = 16..=512;

/// Largest keys file read.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// The file's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysFile {
    /// Every valid key.
    #[serde(default)]
    pub keys: Vec<KeyEntry>,
}

/// One key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    /// The tenant the key authenticates as.
    pub tenant: String,
    /// Lowercase hex SHA-256 of the key.
    pub sha256: String,
    /// A label (who holds the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When it was made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
}

/// A keys file problem.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// Cannot read or write it.
    #[error("keys file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not a valid keys file.
    #[error("keys file {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (with the entry's index).
        message: String,
    },
}

/// Lowercase hex SHA-256 of a key.
pub fn hash_key(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(chunk).ok()?;
        if !text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return None;
        }
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// A new random key: the prefix and 32 bytes from the OS's generator, base64url.
pub fn generate_key() -> Result<String, std::io::Error> {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
    Ok(format!(
        "{KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// Keys ready to check: hashes decoded, tenants validated.
#[derive(Debug, Default)]
pub struct KeySet {
    entries: Vec<([u8; 32], String)>,
}

impl KeySet {
    /// Parses and checks a keys file's text.
    pub fn parse(path: &Path, text: &str) -> Result<KeySet, KeysError> {
        let invalid = |message: String| KeysError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let file: KeysFile = if text.trim().is_empty() {
            KeysFile::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| invalid(e.to_string()))?
        };
        let mut entries = Vec::with_capacity(file.keys.len());
        for (i, k) in file.keys.iter().enumerate() {
            if !valid_tenant_name(&k.tenant) {
                return Err(invalid(format!(
                    "keys[{i}].tenant: {:?} is not a tenant name (1-63 lowercase letters, \
                     digits and '-')",
                    k.tenant
                )));
            }
            let hash = decode_hex32(&k.sha256).ok_or_else(|| {
                invalid(format!(
                    "keys[{i}].sha256: not 64 lowercase hex digits (the key's SHA-256)"
                ))
            })?;
            if entries.iter().any(|(h, _)| *h == hash) {
                return Err(invalid(format!("keys[{i}]: the same key is listed twice")));
            }
            entries.push((hash, k.tenant.clone()));
        }
        Ok(KeySet { entries })
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tenant of `key`, if it is a valid key. Every stored hash is compared, each in
    /// constant time.
    pub fn tenant_of(&self, key: &str) -> Option<&str> {
        if !KEY_LEN.contains(&key.len()) {
            return None;
        }
        let presented: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut found = None;
        for (hash, tenant) in &self.entries {
            if bool::from(hash.ct_eq(&presented)) {
                found = Some(tenant.as_str());
            }
        }
        found
    }
}

/// Reads a keys file (bounded).
pub fn read(path: &Path) -> Result<String, KeysError> {
    use std::io::Read;
    let io = |source| KeysError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(io)?;
    Ok(text)
}

/// Loads and checks a keys file.
pub fn load(path: &Path) -> Result<KeySet, KeysError> {
    KeySet::parse(path, &read(path)?)
}

fn read_file(path: &Path) -> Result<KeysFile, KeysError> {
    let text = match read(path) {
        Ok(t) => t,
        Err(KeysError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            String::new()
        }
        Err(e) => return Err(e),
    };
    // Checked as the gateway would load it, so a broken file is not made worse.
    KeySet::parse(path, &text)?;
    if text.trim().is_empty() {
        return Ok(KeysFile::default());
    }
    serde_yaml_ng::from_str(&text).map_err(|e| KeysError::Invalid {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Writes the file atomically (a temporary file renamed over it), mode 0600.
fn write_file(path: &Path, file: &KeysFile) -> Result<(), KeysError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| KeysError::Io {
        path: path.to_path_buf(),
        source,
    };
    let text = format!(
        "# toolrun API keys: SHA-256 hashes only (toolrun keys create / revoke)\n{}",
        serde_yaml_ng::to_string(file).map_err(|e| KeysError::Invalid {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?
    );
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Makes a key for `tenant`, adds its hash to the file (created if missing) and returns
/// the key: the only time it is ever shown.
pub fn create(path: &Path, tenant: &str, name: Option<&str>) -> Result<String, KeysError> {
    if !valid_tenant_name(tenant) {
        return Err(KeysError::Invalid {
            path: path.to_path_buf(),
            message: format!(
                "--tenant {tenant:?} is not a tenant name (1-63 lowercase letters, digits and '-')"
            ),
        });
    }
    let mut file = read_file(path)?;
    let key = generate_key().map_err(|source| KeysError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    file.keys.push(KeyEntry {
        tenant: tenant.to_string(),
        sha256: hash_key(&key),
        name: name.map(str::to_string),
        created: Some(humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()),
    });
    write_file(path, &file)?;
    Ok(key)
}

/// Removes the keys whose name is `which`, or whose hash starts with it (at least 8 hex
/// digits); returns how many were removed.
pub fn revoke(path: &Path, which: &str) -> Result<usize, KeysError> {
    let mut file = read_file(path)?;
    let before = file.keys.len();
    let by_hash = which.len() >= 8 && decode_hex32(&format!("{which:0<64}")).is_some();
    file.keys.retain(|k| {
        !(k.name.as_deref() == Some(which) || (by_hash && k.sha256.starts_with(which)))
    });
    let removed = before - file.keys.len();
    if removed > 0 {
        write_file(path, &file)?;
    }
    Ok(removed)
}

/// The file's entries.
pub fn list(path: &Path) -> Result<Vec<KeyEntry>, KeysError> {
    Ok(read_file(path)?.keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_by_hash_and_files_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        let a = create(&path, "team-a", Some("ci")).unwrap();
        let b = create(&path, "team-b", None).unwrap();
        assert!(a.starts_with(KEY_PREFIX) && a.len() == 4 + 43, "{a}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&a) && text.contains(&hash_key(&a)), "{text}");
        let set = load(&path).unwrap();
        assert_eq!(set.tenant_of(&a), Some("team-a"));
        assert_eq!(set.tenant_of(&b), Some("team-b"));
        assert_eq!(set.tenant_of(&format!("{a}x")), None);
        assert_eq!(set.tenant_of(""), None);
        assert_eq!(revoke(&path, "ci").unwrap(), 1);
        let set = load(&path).unwrap();
        assert_eq!(set.tenant_of(&a), None);
        assert_eq!(set.tenant_of(&b), Some("team-b"));
        assert_eq!(revoke(&path, &hash_key(&b)[..10]).unwrap(), 1);
        assert!(load(&path).unwrap().is_empty());
        // The chart computes the same hash with sha256sum.
        assert_eq!(
            hash_key("password"),
            "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
        );
        for (text, what) in [
            ("keys: [{tenant: Bad, sha256: x}]", "keys[0].tenant"),
            ("keys: [{tenant: a, sha256: abc}]", "keys[0].sha256"),
            ("keys: [{tenant: a, sha256: abc, extra: 1}]", "extra"),
        ] {
            let e = KeySet::parse(Path::new("k"), text).unwrap_err().to_string();
            assert!(e.contains(what), "{text}: {e}");
        }
        let h = hash_key("k1-0123456789abcdef");
        let e = KeySet::parse(
            Path::new("k"),
            &format!("keys: [{{tenant: a, sha256: {h}}}, {{tenant: b, sha256: {h}}}]"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("twice"), "{e}");
        assert!(create(&path, "Not_A_Tenant", None).is_err());
    }
}
