//! `hash`: BLAKE3 of a string (seed 003).

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ToolError;
use crate::tool::{CallContext, Category, ToolMetadata, TypedTool};

/// How `input` is to be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum Encoding {
    /// The UTF-8 bytes of the string.
    #[default]
    #[serde(rename = "utf-8")]
    Utf8,
    /// Standard base64 (RFC 4648, with padding), decoded first.
    #[serde(rename = "base64")]
    Base64,
}

/// Arguments of `hash`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HashInput {
    /// The data to hash.
    #[schemars(length(max = 1048576))]
    pub input: String,
    /// How `input` is encoded (default utf-8).
    #[serde(default)]
    pub encoding: Encoding,
}

/// Output of `hash`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct HashOutput {
    /// Lowercase hex BLAKE3 digest (64 characters).
    pub hash: String,
    /// Always `blake3`.
    pub algorithm: &'static str,
}

/// The hash tool.
pub struct Hash;

impl TypedTool for Hash {
    type Input = HashInput;
    type Output = HashOutput;

    fn metadata(&self) -> ToolMetadata {
        ToolMetadata::pure_inline(
            "hash",
            "Hash",
            "Computes the BLAKE3 hash of a string (utf-8 text or base64 bytes) as lowercase hex.",
            Category::Computation,
        )
    }

    async fn run(&self, input: HashInput, _ctx: &CallContext) -> Result<HashOutput, ToolError> {
        let hash = match input.encoding {
            Encoding::Utf8 => blake3::hash(input.input.as_bytes()),
            Encoding::Base64 => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(input.input.as_bytes())
                    .map_err(|e| {
                        ToolError::invalid_arguments(format!("input is not valid base64: {e}"))
                    })?;
                blake3::hash(&bytes)
            }
        };
        Ok(HashOutput {
            hash: hash.to_hex().to_string(),
            algorithm: "blake3",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ctx() -> CallContext {
        CallContext::with_timeout("t", Duration::from_secs(1))
    }

    #[tokio::test]
    async fn known_vectors() {
        // BLAKE3 of the empty input, from the BLAKE3 specification's test vectors.
        let out = Hash
            .run(
                HashInput {
                    input: String::new(),
                    encoding: Encoding::Utf8,
                },
                &ctx(),
            )
            .await
            .unwrap();
        assert_eq!(
            out.hash,
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        let a = Hash
            .run(
                HashInput {
                    input: "hello".into(),
                    encoding: Encoding::Utf8,
                },
                &ctx(),
            )
            .await
            .unwrap();
        let b = Hash
            .run(
                HashInput {
                    input: "aGVsbG8=".into(),
                    encoding: Encoding::Base64,
                },
                &ctx(),
            )
            .await
            .unwrap();
        assert_eq!(a.hash, b.hash);
    }

    #[tokio::test]
    async fn bad_base64_is_invalid_arguments() {
        let err = Hash
            .run(
                HashInput {
                    input: "***".into(),
                    encoding: Encoding::Base64,
                },
                &ctx(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, crate::error::ErrorCode::InvalidArguments);
    }
}
