//! Labels on a ToolRun's children, shared by the operator (which sets them) and the
//! gateway (which selects on them).

/// Name of the ToolRun a pod or ConfigMap belongs to.
pub const RUN: &str = "toolrun.dev/run";
/// The caller's call id, as a label value ([`label_value`]).
pub const CALL_ID: &str = "toolrun.dev/call-id";
/// The caller's tenant (empty: a gateway without authentication), on ToolRuns the
/// gateway creates; select a tenant's runs with `-l toolrun.dev/tenant=NAME`.
pub const TENANT: &str = "toolrun.dev/tenant";
/// Name of the ToolSession a ToolRun runs in (and of the session's pod): select a
/// session's runs with `-l toolrun.dev/session=NAME`.
pub const SESSION: &str = "toolrun.dev/session";
/// The caller's session id on a ToolSession, as a label value ([`label_value`]).
pub const SESSION_ID: &str = "toolrun.dev/session-id";
/// The caller's session id on a ToolSession, unchanged (an annotation).
pub const SESSION_ID_ANNOTATION: &str = "toolrun.dev/session-id";
/// Annotation on a ToolSession: the last call the gateway served in it (RFC 3339), which
/// the operator turns into `status.lastActivity` and `status.expiresAt`.
pub const LAST_ACTIVITY: &str = "toolrun.dev/last-activity";
/// Marks sandbox pods; the deny-all NetworkPolicy selects it.
pub const SANDBOX: &str = "toolrun.dev/sandbox";
/// Value of [`SANDBOX`].
pub const SANDBOX_VALUE: &str = "true";
/// `app.kubernetes.io/managed-by`.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`] on everything the operator creates.
pub const MANAGED_BY_VALUE: &str = "toolrun-operator";
/// On warm pods: the language whose pool the pod belongs to. A warm pod without an owner
/// is ready for work; one that a ToolRun owns (and that carries its [`RUN`] label) was
/// claimed by that run and is deleted after it.
pub const WARM_POOL: &str = "toolrun.dev/warm-pool";

/// Longest label value Kubernetes accepts.
pub const MAX_LABEL_VALUE: usize = 63;

/// `s` as a valid label value: `s` itself when it already is one, otherwise its allowed
/// characters (others replaced by `-`, trimmed to start and end alphanumeric, at most 54
/// characters) followed by `-` and 8 hex digits of a hash of the whole of `s`, so two
/// different ids do not collide on the same cut-down value. Deterministic across
/// versions and processes (FNV-1a, not the std hasher), so the gateway and the operator
/// agree. The empty string stays empty (a valid label value).
pub fn label_value(s: &str) -> String {
    if is_label_value(s) {
        return s.to_string();
    }
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut prefix: &str = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.len() > MAX_LABEL_VALUE - 9 {
        prefix =
            prefix[..MAX_LABEL_VALUE - 9].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    }
    let hash = format!("{:08x}", fnv1a32(s.as_bytes()));
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// `s` is a valid label value: at most 63 characters, alphanumerics, `-`, `_` and `.`,
/// starting and ending with an alphanumeric (or empty).
pub fn is_label_value(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    let b = s.as_bytes();
    b.len() <= MAX_LABEL_VALUE
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `s` is a DNS-1123 label: what Kubernetes accepts as a namespace name (and the name of
/// a Lease): at most 63 lowercase alphanumerics or `-`, starting and ending with an
/// alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL_VALUE
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(is_dns_label("toolrun-sandbox") && is_dns_label(&"a".repeat(63)));
        assert!(!is_dns_label(&"a".repeat(64)) && !is_dns_label("-a") && !is_dns_label("a-"));
        assert!(!is_dns_label("") && !is_dns_label("Upper") && !is_dns_label("a.b"));
    }

    #[test]
    fn valid_values_are_kept() {
        for s in ["", "call_1", "abc.DEF-9", &"a".repeat(63)] {
            assert_eq!(label_value(s), s);
        }
    }

    #[test]
    fn invalid_values_become_valid_and_distinct() {
        let long = "x".repeat(200);
        let cases = [
            "call 1",
            "call/1",
            "call:1",
            "-leading",
            "trailing_",
            "ünïcode",
            "!!!",
            "toolu_01ABC/../etc",
            long.as_str(),
        ];
        let mut seen = std::collections::HashSet::new();
        for s in cases {
            let v = label_value(s);
            assert!(is_label_value(&v), "{s:?} -> {v:?} is not a label value");
            assert!(!v.is_empty(), "{s:?} -> empty");
            assert!(seen.insert(v.clone()), "{s:?} -> {v:?} collides");
        }
        // Same input, same output (the gateway and the operator must agree).
        assert_eq!(label_value("call 1"), label_value("call 1"));
        assert_ne!(label_value("call 1"), label_value("call/1"));
        assert!(label_value("call 1").starts_with("call-1-"));
        assert_eq!(label_value(&long).len(), MAX_LABEL_VALUE);
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }
}
