//! Built-in presets: the TOML files of `examples/sim/`, embedded at build time so
//! `flashpool sim run --preset NAME` works from any directory.

use crate::config::{ConfigError, SimConfig};

/// (name, TOML text) of every preset.
pub const PRESETS: &[(&str, &str)] = &[
    ("slc", include_str!("../../../examples/sim/slc.toml")),
    ("mlc", include_str!("../../../examples/sim/mlc.toml")),
    ("tlc", include_str!("../../../examples/sim/tlc.toml")),
    ("qlc", include_str!("../../../examples/sim/qlc.toml")),
    ("small", include_str!("../../../examples/sim/small.toml")),
];

/// The TOML text of preset `name`.
pub fn preset_text(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The presets' names, comma-separated (for messages listing what is known).
pub fn names() -> String {
    let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
    names.join(", ")
}

/// Parses preset `name`.
pub fn preset(name: &str) -> Result<SimConfig, ConfigError> {
    let text = preset_text(name)
        .ok_or_else(|| ConfigError(format!("unknown preset {name:?}; known: {}", names())))?;
    SimConfig::from_toml(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_presets_parse() {
        for (name, _) in PRESETS {
            let c = preset(name).unwrap();
            assert_eq!(c.name.as_deref(), Some(*name));
        }
        assert!(preset("nope").is_err());
    }
}
