//! Mutual TLS: the identity of a verified client certificate, and which tenant it maps to.
//!
//! A tenant lists the certificate names it accepts in `auth.tenants.NAME.client_certs`:
//!
//! ```yaml
//! auth:
//!   tenants:
//!     agents:
//!       client_certs: ["CN=agent-a", "spiffe://cluster.local/ns/agents/sa/runner", "DNS:bot.example"]
//! ```
//!
//! - `CN=<name>`: the subject's common name;
//! - `DNS:<name>`: a DNS subject alternative name (compared without case);
//! - `URI:<uri>`, or a bare `scheme://...` such as a SPIFFE ID: a URI subject alternative
//!   name (compared exactly).
//!
//! The chain is verified by rustls against `tls.client_ca_file` before any of this runs;
//! here the leaf is only read (with x509-parser: rustls and webpki verify chains but expose
//! neither the subject's CN nor URI SANs). A certificate whose names map to no tenant, or
//! to more than one, is refused.

use std::collections::HashMap;
use std::sync::Arc;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// One name a certificate can carry, as the configuration writes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CertName {
    /// Subject common name.
    Cn(String),
    /// DNS subject alternative name (lowercase).
    Dns(String),
    /// URI subject alternative name (e.g. a SPIFFE ID).
    Uri(String),
}

impl CertName {
    /// Parses `CN=x`, `DNS:x`, `URI:x` or a bare `scheme://...`.
    pub fn parse(text: &str) -> Result<CertName, String> {
        let text = text.trim();
        let bad = || {
            format!(
                "{text:?} is not a certificate name: write CN=<common name>, DNS:<name>, \
                 URI:<uri> or a URI such as spiffe://trust-domain/path"
            )
        };
        let nonempty = |v: &str| {
            let v = v.trim();
            (!v.is_empty() && v.len() <= 1024 && !v.chars().any(char::is_control))
                .then(|| v.to_string())
                .ok_or_else(bad)
        };
        if let Some(v) = strip_prefix_ci(text, "CN=") {
            Ok(CertName::Cn(nonempty(v)?))
        } else if let Some(v) = strip_prefix_ci(text, "DNS:") {
            Ok(CertName::Dns(nonempty(v)?.to_ascii_lowercase()))
        } else if let Some(v) = strip_prefix_ci(text, "URI:") {
            Ok(CertName::Uri(nonempty(v)?))
        } else if let Some((scheme, rest)) = text.split_once("://")
            && !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            && !rest.is_empty()
        {
            Ok(CertName::Uri(nonempty(text)?))
        } else {
            Err(bad())
        }
    }
}

fn strip_prefix_ci<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

impl std::fmt::Display for CertName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CertName::Cn(v) => write!(f, "CN={v}"),
            CertName::Dns(v) => write!(f, "DNS:{v}"),
            CertName::Uri(v) => write!(f, "URI:{v}"),
        }
    }
}

/// The names of a verified client certificate (its leaf), read once per connection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientIdentity {
    /// Subject CNs, then DNS SANs, then URI SANs.
    pub names: Vec<CertName>,
}

/// The leaf certificate could not be read (rustls accepted it, so this is rare: an
/// extension x509-parser rejects).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("client certificate unreadable: {0}")]
pub struct IdentityError(String);

impl ClientIdentity {
    /// The names of the DER certificate `der`.
    pub fn from_der(der: &[u8]) -> Result<ClientIdentity, IdentityError> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| IdentityError(e.to_string()))?;
        let mut names = Vec::new();
        for cn in cert.subject().iter_common_name() {
            if let Ok(v) = cn.as_str() {
                names.push(CertName::Cn(v.to_string()));
            }
        }
        let san = cert
            .subject_alternative_name()
            .map_err(|e| IdentityError(e.to_string()))?;
        for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
            match name {
                GeneralName::DNSName(v) => names.push(CertName::Dns(v.to_ascii_lowercase())),
                GeneralName::URI(v) => names.push(CertName::Uri(v.to_string())),
                _ => {}
            }
        }
        Ok(ClientIdentity { names })
    }

    /// The names as logs show them (`CN=a, URI:spiffe://...`), bounded.
    pub fn describe(&self) -> String {
        let mut s = self
            .names
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        if s.is_empty() {
            s = "(no CN, DNS or URI name)".into();
        }
        if s.len() > 300 {
            let mut end = 300;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
            s.push('…');
        }
        s
    }
}

/// Why a certificate does not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    /// None of its names is mapped.
    #[error("no tenant maps any of the client certificate's names")]
    NotMapped,
    /// Its names map to different tenants.
    #[error("the client certificate's names map to more than one tenant")]
    Ambiguous,
}

/// Certificate names to tenants (`auth.tenants.*.client_certs`).
#[derive(Debug, Default, Clone)]
pub struct CertMap {
    names: HashMap<CertName, Arc<str>>,
}

impl CertMap {
    /// Builds the map; `(tenant, entry)` pairs already validated by the config.
    pub fn new<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> CertMap {
        let names = entries
            .into_iter()
            .filter_map(|(tenant, entry)| Some((CertName::parse(entry).ok()?, Arc::from(tenant))))
            .collect();
        CertMap { names }
    }

    /// Number of mapped names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// No names are mapped.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The tenant of `identity`: the one tenant its names map to.
    pub fn tenant_of(&self, identity: &ClientIdentity) -> Result<Arc<str>, MappingError> {
        let mut found: Option<&Arc<str>> = None;
        for name in &identity.names {
            if let Some(t) = self.names.get(name) {
                match found {
                    Some(f) if f != t => return Err(MappingError::Ambiguous),
                    _ => found = Some(t),
                }
            }
        }
        found.cloned().ok_or(MappingError::NotMapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_map_to_one_tenant() {
        assert_eq!(
            CertName::parse("CN=agent-a").unwrap(),
            CertName::Cn("agent-a".into())
        );
        assert_eq!(
            CertName::parse("dns:Bot.Example").unwrap(),
            CertName::Dns("bot.example".into())
        );
        assert_eq!(
            CertName::parse("spiffe://c/ns/x/sa/y").unwrap(),
            CertName::Uri("spiffe://c/ns/x/sa/y".into())
        );
        assert_eq!(
            CertName::parse("URI:https://a.example/x").unwrap(),
            CertName::Uri("https://a.example/x".into())
        );
        for bad in [
            "agent-a",
            "CN=",
            "DNS: ",
            "://x",
            "spiffe://",
            "CN=a\nb",
            "O=org",
        ] {
            assert!(CertName::parse(bad).is_err(), "{bad:?}");
        }
        let map = CertMap::new([
            ("team-a", "CN=agent-a"),
            ("team-a", "spiffe://c/ns/a/sa/x"),
            ("team-b", "DNS:b.example"),
        ]);
        let id = |names: &[CertName]| ClientIdentity {
            names: names.to_vec(),
        };
        assert_eq!(
            &*map
                .tenant_of(&id(&[CertName::Cn("agent-a".into())]))
                .unwrap(),
            "team-a"
        );
        assert_eq!(
            &*map
                .tenant_of(&id(&[
                    CertName::Cn("agent-a".into()),
                    CertName::Uri("spiffe://c/ns/a/sa/x".into())
                ]))
                .unwrap(),
            "team-a",
            "two names of one tenant"
        );
        assert_eq!(
            map.tenant_of(&id(&[CertName::Cn("agent-b".into())])),
            Err(MappingError::NotMapped)
        );
        assert_eq!(
            map.tenant_of(&id(&[CertName::Dns("agent-a".into())])),
            Err(MappingError::NotMapped),
            "a DNS name is not a CN"
        );
        assert_eq!(
            map.tenant_of(&id(&[
                CertName::Cn("agent-a".into()),
                CertName::Dns("b.example".into())
            ])),
            Err(MappingError::Ambiguous)
        );
        assert_eq!(map.tenant_of(&id(&[])), Err(MappingError::NotMapped));
    }

    #[test]
    fn a_certificates_cn_dns_and_uri_names_are_read() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["Bot.Example".to_string(), "10.0.0.1".to_string()])
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "agent-a");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "not a name that maps");
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://c/ns/x/sa/y".to_string().try_into().unwrap(),
        ));
        let cert = params.self_signed(&key).unwrap();
        let id = ClientIdentity::from_der(cert.der()).unwrap();
        assert_eq!(
            id.names,
            [
                CertName::Cn("agent-a".into()),
                CertName::Dns("bot.example".into()),
                CertName::Uri("spiffe://c/ns/x/sa/y".into()),
            ]
        );
        assert_eq!(
            id.describe(),
            "CN=agent-a, DNS:bot.example, URI:spiffe://c/ns/x/sa/y"
        );
        assert!(ClientIdentity::from_der(b"not DER").is_err());
    }
}
