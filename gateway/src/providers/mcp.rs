//! Model Context Protocol `tools/list` entries (used by `ListTools` with
//! `TOOL_FORMAT_MCP` and `toolrun tools --format mcp`): exactly what the MCP endpoint lists
//! ([`crate::mcp::tools::tool`]), so the two cannot drift apart.

use serde_json::Value;

use crate::registry::Entry;

/// The `tools/list` entry for `entry`.
pub fn definition(entry: &Entry) -> Value {
    serde_json::to_value(crate::mcp::tools::tool(entry))
        .expect("an MCP tool definition always serialises")
}
