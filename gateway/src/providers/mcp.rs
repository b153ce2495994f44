//! Model Context Protocol `tools/list` entries (used by `ListTools` with
//! `TOOL_FORMAT_MCP` and `toolrun tools --format mcp`).

use serde_json::{Value, json};

use crate::registry::Entry;
use crate::tool::{Determinism, SideEffect};

/// The `tools/list` entry for `entry`.
pub fn definition(entry: &Entry) -> Value {
    let m = entry.tool.metadata();
    json!({
        "name": m.id,
        "title": m.name,
        "description": m.description,
        "inputSchema": entry.tool.input_schema(),
        "outputSchema": entry.tool.output_schema(),
        "annotations": {
            "title": m.name,
            "readOnlyHint": m.side_effect == SideEffect::Pure,
            "idempotentHint": m.determinism == Determinism::Deterministic,
            "openWorldHint": false,
        }
    })
}
