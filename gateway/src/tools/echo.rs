//! `echo`: returns its arguments unchanged (seed 003).

use serde_json::{Map, Value};

use crate::error::ToolError;
use crate::tool::{
    ApprovalPolicy, CallContext, Category, Determinism, SideEffect, ToolMetadata, TypedTool,
};

/// The echo tool.
pub struct Echo;

impl TypedTool for Echo {
    type Input = Map<String, Value>;
    type Output = Map<String, Value>;

    fn metadata(&self) -> ToolMetadata {
        ToolMetadata {
            id: "echo",
            name: "Echo",
            description: "Returns its arguments (any JSON object) unchanged.",
            version: "1.0.0",
            category: Category::Utility,
            sandbox_required: false,
            side_effect: SideEffect::Pure,
            determinism: Determinism::Deterministic,
            required_capabilities: &[],
            approval: ApprovalPolicy::Never,
            max_memory_bytes: None,
        }
    }

    async fn run(&self, input: Self::Input, _ctx: &CallContext) -> Result<Self::Output, ToolError> {
        Ok(input)
    }
}
