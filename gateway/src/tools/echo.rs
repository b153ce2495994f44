//! `echo`: returns its arguments unchanged (seed 003).

use serde_json::{Map, Value};

use crate::error::ToolError;
use crate::tool::{CallContext, Category, ToolMetadata, TypedTool};

/// The echo tool.
pub struct Echo;

impl TypedTool for Echo {
    type Input = Map<String, Value>;
    type Output = Map<String, Value>;

    fn metadata(&self) -> ToolMetadata {
        ToolMetadata::pure_inline(
            "echo",
            "Echo",
            "Returns its arguments (any JSON object) unchanged.",
            Category::Utility,
        )
    }

    async fn run(&self, input: Self::Input, _ctx: &CallContext) -> Result<Self::Output, ToolError> {
        Ok(input)
    }
}
