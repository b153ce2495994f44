//! The configuration loader (gateway/src/config.rs): any YAML text gives a validated
//! Config or a typed error naming the key, never a panic or a hang (aliases included).
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolrun::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = Config::from_yaml(text) {
        // What the gateway derives from a loaded config at startup.
        config
            .validate()
            .expect("from_yaml returns only valid configs");
        for id in config.tools.keys() {
            let _ = config.tool(id);
        }
        let _ = config.sandbox.limits.merged(None);
    }
});
