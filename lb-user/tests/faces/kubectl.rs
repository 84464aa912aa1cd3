//! The faces as kubectl users expect them: namespaces, output formats, all nodes, completion, man pages, and
//! the docs checked against `--help`.
use super::*;

#[test]
fn the_faces_speak_kubectl_namespaces_output_formats_all_nodes_and_empty_lists() {
    let story = story();
    // explain NAME -n NS, as kubectl; NS/NAME alone; a contradiction is a usage error naming both.
    let (code, by_n, _) =
        tierlb(&["explain", "-n", "booking", "nginx-cache", "--node", "node-2", "--manifests", &story]);
    assert_eq!(code, 0, "{by_n}");
    let (_, by_key, _) =
        tierlb(&["explain", "booking/nginx-cache", "--node", "node-2", "--manifests", &story]);
    assert_eq!(by_n, by_key);
    let (code, _, err) =
        tierlb(&["explain", "-n", "shop", "booking/nginx-cache", "--node", "node-2", "--manifests", &story]);
    assert_eq!(code, 1);
    assert!(err.contains("--namespace shop does not hold Service booking/nginx-cache"), "{err}");
    // explain -o json|yaml: the Service's port plans with their warnings, as plan -o json has them.
    let (code, json, _) =
        tierlb(&["explain", "booking/nginx-cache", "--node", "node-2", "--manifests", &story, "-o", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let ports = v["services"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "only the Service asked for: {json}");
    assert_eq!(ports[0]["internal"]["endpoints"], serde_json::json!(["10.244.2.10:8080"]));
    assert!(ports[0]["warnings"][0].as_str().unwrap().contains("dead line"), "{json}");
    let (_, yaml, _) =
        tierlb(&["explain", "booking/nginx-cache", "--node", "node-2", "--manifests", &story, "-o", "yaml"]);
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(from_yaml, v, "YAML holds what JSON does");
    // plan -o wide: READY and TOPOLOGY columns, as the agent's metric says them.
    let (_, wide, _) = tierlb(&["plan", "--node", "node-1", "--manifests", &story, "-o", "wide"]);
    let header: Vec<&str> =
        wide.lines().nth(1).unwrap().split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(header[header.len() - 2..], ["READY", "TOPOLOGY (requested:applied:reason)"], "{wide}");
    let cache: Vec<&str> = wide
        .lines()
        .find(|l| l.starts_with("booking/nginx-cache:http"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(cache[cache.len() - 2..], ["2/3,local=1", "Local:local:local_policy_overrides_distribution"]);
    // plan --all-nodes: one table, NODE first, a row per node and port.
    let (code, all, _) = tierlb(&["plan", "--all-nodes", "--manifests", &story]);
    assert_eq!(code, 0);
    let cache_rows: Vec<Vec<&str>> = all
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|r| r.get(1) == Some(&"booking/nginx-cache:http"))
        .collect();
    let by_node: Vec<(&str, &str)> = cache_rows.iter().map(|r| (r[0], r[6])).collect();
    assert_eq!(
        by_node,
        [
            ("node-1", "10.244.1.10:8080"),
            ("node-2", "10.244.2.10:8080(terminating)"),
            ("node-3", "10.244.3.10:8080")
        ],
        "{all}"
    );
    let (_, json, _) = tierlb(&["plan", "--all-nodes", "--manifests", &story, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let nodes: Vec<&str> = v.as_array().unwrap().iter().map(|p| p["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["node-1", "node-2", "node-3"]);
    // A namespace with nothing: kubectl's sentence, no table, exit 0.
    let (code, out, err) = tierlb(&["plan", "--node", "node-1", "--manifests", &story, "-n", "nope"]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert!(err.lines().any(|l| l.starts_with("No resources found in ")), "{err}");
    assert!(!err.contains("pdf-resume"), "notes about other namespaces' Services are not said: {err}");
}

#[test]
fn completion_and_man_pages_are_generated_from_the_command_line() {
    // bash completes a subcommand and a flag from the script `tierlb completion bash` prints.
    let complete = |words: &str| {
        let script = format!(
            "source <({TIERLB} completion bash); COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _tierlb tierlb \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; echo \"${{COMPREPLY[@]}}\""
        );
        let out = Command::new("bash").args(["-c", &script]).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(complete("tierlb pl"), "plan");
    assert_eq!(complete("tierlb plan --all-n"), "--all-nodes");
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        let (code, out, _) = tierlb(&["completion", shell]);
        assert!(code == 0 && out.contains("explain"), "{shell}: {out}");
    }
    // A page for tierlb listing every command, and one per command with its flags.
    let (code, page, _) = tierlb(&["man"]);
    assert_eq!(code, 0);
    assert!(page.contains(".TH tierlb 1"), "{page}");
    for cmd in ["agent", "plan", "explain", "lint", "study", "status", "backend", "trace", "completion"] {
        assert!(page.contains(&format!("tierlb\\-{cmd}(1)")), "tierlb(1) lists {cmd}:\n{page}");
    }
    let (_, plan, _) = tierlb(&["man", "plan"]);
    assert!(plan.contains(".TH tierlb-plan 1") && plan.contains("\\-\\-all\\-nodes"), "{plan}");
    let (code, _, err) = tierlb(&["man", "plna"]);
    assert_eq!(code, 1);
    assert!(err.contains("no command plna: one of agent, plan"), "{err}");
}

/// Every command's path (`[]`, `["plan"]`, `["backend", "down"]`), from the command line's definition.
fn command_paths() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, path: &[String], out: &mut Vec<Vec<String>>) {
        out.push(path.to_vec());
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut p = path.to_vec();
            p.push(sub.get_name().to_owned());
            walk(sub, &p, out);
        }
    }
    let mut out = Vec::new();
    walk(&<tierlb::cli::Cli as clap::CommandFactory>::command(), &[], &mut out);
    out
}

/// docs/cli-reference.md: every command's `--help`, as the binary prints it (`TIERLB_BLESS=1` rewrites it),
/// and every long flag of every command named in docs/cli.md, so neither drifts from the command line.
#[test]
fn the_cli_docs_match_every_commands_help() {
    let mut reference = String::from(
        "# tierlb command line reference\n\nGenerated from the binary: each command's `--help` (a test checks it \
         and `TIERLB_BLESS=1` rewrites it). [cli.md](cli.md) explains each command.\n",
    );
    let cli_md =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md")).unwrap();
    let mut undocumented = Vec::new();
    for path in command_paths() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out =
            Command::new(TIERLB).args(&args).env_remove(tierlb::datapath::pins::BPFFS_ENV).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let help = String::from_utf8(out.stdout).unwrap();
        let name =
            std::iter::once("tierlb").chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join(" ");
        let _ = write!(reference, "\n## `{name}`\n\n```\n{}\n```\n", help.trim_end());
        for flag in help.split_whitespace().filter_map(|w| w.strip_prefix("--")) {
            let flag = flag.trim_end_matches([',', '.', ')', ':', ';', ']']);
            let flag = flag.split(['=', '<', '[']).next().unwrap();
            if flag.len() > 1
                && !["help", "version"].contains(&flag)
                && !cli_md.contains(&format!("--{flag}"))
            {
                undocumented.push(format!("{name} --{flag}"));
            }
        }
    }
    undocumented.sort();
    undocumented.dedup();
    assert!(undocumented.is_empty(), "flags docs/cli.md never names:\n{}", undocumented.join("\n"));
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli-reference.md");
    if std::env::var_os("TIERLB_BLESS").is_some() {
        std::fs::write(&file, &reference).unwrap();
    }
    let written = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        written == reference,
        "docs/cli-reference.md differs from the commands' --help: run `TIERLB_BLESS=1 cargo nextest run -E \
         'test(the_cli_docs_match)'` and commit it"
    );
}

#[test]
fn status_names_a_missing_bpffs_once_with_the_fix() {
    let (code, _, err) = tierlb(&["status", "--bpffs", "/nonexistent/tierlb"]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim_end(),
        "tierlb: error: --bpffs /nonexistent/tierlb: no such directory, so no agent pins there: pass the agent's \
         --bpffs, or set TIERLB_BPFFS to it (the DaemonSet's pod has it set)"
    );
    let (code, _, err) = tierlb(&["plan", "--node", "n", "--kube", "--kubeconfig", "/nonexistent/config"]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim_end(),
        "tierlb: error: --kubeconfig /nonexistent/config: cannot read it: No such file or directory (os error 2)",
        "each cause once, the path as given"
    );
}

/// kube-proxy's flag names are accepted beside tierlb's, and `--config FILE` holds flags the command line
/// overrides; a key that is no flag is refused with the one it is likely a typo of.
#[test]
fn the_agent_takes_kube_proxys_flag_names_and_a_config_file_the_command_line_overrides() {
    use tierlb::cli::{Cli, Command as Sub, expand_config};
    let dir = TempDir::new("faces-config").unwrap();
    let file = dir.path().join("agent.yaml");
    std::fs::write(
        &file,
        "hostname-override: node-9\nmanifests: /etc/tierlb/manifests\nmetrics-bind-address: 127.0.0.1:19249\n\
         healthz-bind-address: 0.0.0.0:20256\nprotect-address: [192.0.2.1:443, 192.0.2.2:443]\ncleanup: false\n",
    )
    .unwrap();
    let parse = |args: &[&str]| {
        let argv = std::iter::once("tierlb").chain(args.iter().copied()).map(Into::into).collect();
        let cli = Cli::try_parse_from_args(
            &expand_config(argv)
                .unwrap()
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let Sub::Agent(a) = cli.command else { panic!("agent") };
        a
    };
    let config = file.to_str().unwrap();
    let a = parse(&["agent", "--config", config]);
    assert_eq!(a.node.node, "node-9");
    assert_eq!(a.manifests.as_deref(), Some(Path::new("/etc/tierlb/manifests")));
    assert_eq!(a.metrics_addr.0, Some("127.0.0.1:19249".parse().unwrap()));
    assert_eq!(a.healthz_addr.0, Some("0.0.0.0:20256".parse().unwrap()));
    let protected: Vec<String> = a.node.site.protect_addresses.iter().map(ToString::to_string).collect();
    assert_eq!(protected, ["192.0.2.1:443", "192.0.2.2:443"]);
    // The command line wins, under either name.
    let a = parse(&["agent", "--config", config, "--node", "node-1", "--metrics-addr=off"]);
    assert_eq!((a.node.node.as_str(), a.metrics_addr.0), ("node-1", None));
    let a = parse(&[
        "agent",
        "--hostname-override",
        "node-2",
        "--manifests",
        "/m",
        "--healthz-bind-address",
        "127.0.0.1:1",
    ]);
    assert_eq!((a.node.node.as_str(), a.healthz_addr.0), ("node-2", Some("127.0.0.1:1".parse().unwrap())));
    // A key that is no flag: exit status 2 and the likely flag.
    std::fs::write(&file, "nodee: node-1\n").unwrap();
    let (code, _, err) = tierlb(&["agent", "--config", config]);
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("--config {config}: nodee is no flag of tierlb agent; did you mean node?")),
        "{err}"
    );
}

/// `explain --all-nodes`: the Service explained on every node of the source, one after the other (the
/// story's dead line shows on the node without a local endpoint), and in JSON one plan per node.
#[test]
fn explain_all_nodes_explains_the_service_on_every_node() {
    let story = story();
    let (code, out, err) = tierlb(&["explain", "booking/nginx-cache", "--all-nodes", "--manifests", &story]);
    assert_eq!(code, 0, "{err}");
    // Its notes are about the Service asked for (the story's pdf-resume, unhinted, is not).
    assert!(!err.contains("pdf-resume"), "{err}");
    let headings: Vec<&str> =
        out.lines().filter(|l| l.starts_with("Service booking/nginx-cache on node ")).collect();
    assert_eq!(headings.len(), 3, "one explanation per node: {out}");
    for n in ["node-1", "node-2", "node-3"] {
        assert!(headings.iter().any(|h| h.contains(&format!("on node {n} "))), "{n}: {headings:?}");
    }
    let (code, json, err) =
        tierlb(&["explain", "booking/nginx-cache", "--all-nodes", "-o", "json", "--manifests", &story]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let nodes: Vec<&str> = v.as_array().unwrap().iter().map(|p| p["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["node-1", "node-2", "node-3"], "{json}");
    let (code, _, err) =
        tierlb(&["explain", "booking/nginx-cache", "--all-nodes", "--node", "node-1", "--manifests", &story]);
    assert_eq!(code, 2, "--all-nodes and --node together are a usage error: {err}");
    // A source that names no node has nothing to explain across nodes: said, not an empty answer.
    let tmp = TempDir::new("faces-no-node").unwrap();
    let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 10.96.0.9\n  ports: [{port: 80}]\n";
    std::fs::write(tmp.path().join("web.yaml"), svc).unwrap();
    let (code, out, err) =
        tierlb(&["explain", "shop/web", "--all-nodes", "--manifests", tmp.path().to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(err.contains("names no node") && err.contains("give --node NAME"), "{err}");
}
