//! `tierlb agent --config FILE`: a YAML file of the agent's flags, expanded into the command line before
//! clap reads it.
use std::path::PathBuf;

use super::Cli;

/// `argv` with `tierlb agent --config FILE` expanded: the file's flags put right after `agent`, before the
/// command line's own, so that those win (`AgentArgs` takes a flag's last value). Each key of the YAML
/// mapping is a long flag or alias of `tierlb agent` without `--`; a value `true` gives the bare flag,
/// `false` nothing, a list the flag once per item, anything else `--key=value`.
pub fn expand_config(argv: Vec<std::ffi::OsString>) -> anyhow::Result<Vec<std::ffi::OsString>> {
    use std::ffi::OsString;
    let Some(agent) = argv.iter().position(|a| a == "agent") else { return Ok(argv) };
    let mut path = None;
    for (i, a) in argv.iter().enumerate().skip(agent + 1) {
        let a = a.to_string_lossy();
        if a == "--config" {
            path = argv.get(i + 1).map(PathBuf::from);
        } else if let Some(p) = a.strip_prefix("--config=") {
            path = Some(PathBuf::from(p));
        }
    }
    let Some(path) = path else { return Ok(argv) };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("--config {}: cannot read it: {e}", path.display()))?;
    let value: serde_json::Value = serde_saphyr::from_str(&text)
        .map_err(|e| anyhow::anyhow!("--config {}: not YAML: {e}", path.display()))?;
    let Some(map) = value.as_object() else {
        anyhow::bail!("--config {}: a mapping of flag names to values, as `node: node-1`", path.display());
    };
    let cli = <Cli as clap::CommandFactory>::command();
    let cmd = cli.find_subcommand("agent").expect("the agent command");
    let known: Vec<&str> = cmd
        .get_arguments()
        .filter(|a| a.get_id() != "config")
        .flat_map(|a| a.get_long().into_iter().chain(a.get_all_aliases().into_iter().flatten()))
        .collect();
    let mut flags = Vec::new();
    for (key, v) in map {
        if !known.contains(&key.as_str()) {
            let hint = crate::spelling::closest(key, known.iter().copied())
                .map(|k| format!("; did you mean {k}?"))
                .unwrap_or_default();
            anyhow::bail!("--config {}: {key} is no flag of tierlb agent{hint}", path.display());
        }
        let items: Vec<&serde_json::Value> = match v {
            serde_json::Value::Array(items) => items.iter().collect(),
            other => vec![other],
        };
        for item in items {
            match item {
                serde_json::Value::Bool(true) => flags.push(OsString::from(format!("--{key}"))),
                serde_json::Value::Bool(false) | serde_json::Value::Null => {}
                serde_json::Value::String(s) => flags.push(OsString::from(format!("--{key}={s}"))),
                serde_json::Value::Number(n) => flags.push(OsString::from(format!("--{key}={n}"))),
                other => anyhow::bail!("--config {}: {key}: {other} is not a flag's value", path.display()),
            }
        }
    }
    let mut out = argv;
    let at = agent + 1;
    out.splice(at..at, flags);
    Ok(out)
}
