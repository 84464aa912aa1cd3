//! What is generated from the command line's definition: shell completion scripts and man pages.
use super::Cli;

/// `tierlb completion`.
#[derive(clap::Args, Debug)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `tierlb man`.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// The command whose page to print (default: tierlb's own, which lists them).
    pub command: Option<String>,
}

/// `tierlb completion SHELL`: the script, generated from this command line.
pub fn run_completion(args: &CompletionArgs) -> String {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut <Cli as clap::CommandFactory>::command(), "tierlb", &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// `tierlb man [COMMAND]`: the page in roff, generated from this command line.
pub fn run_man(args: &ManArgs) -> anyhow::Result<String> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    let man = match &args.command {
        None => clap_mangen::Man::new(cmd),
        Some(name) => {
            let names: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_owned()).collect();
            let Some(sub) = cmd.find_subcommand(name) else {
                anyhow::bail!("no command {name}: one of {}", names.join(", "));
            };
            // Titled as its page is named (`tierlb-plan(1)`).
            clap_mangen::Man::new(sub.clone()).title(format!("tierlb-{name}"))
        }
    };
    let mut out = Vec::new();
    man.render(&mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}
