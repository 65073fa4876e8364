//! `oxcd --help`: etcd's help (etcdmain/help.go), its sections and wording,
//! with each flag that has no effect in oxcd marked, and why.

use super::{Effect, Group, Spec};

/// What etcd prints above its flags, and on a flag error.
pub const USAGE: &str = "Usage:

  oxcd [flags]
    Start an oxcd member (an etcd v3 server).

  oxcd --version
    Show the version of oxcd.

  oxcd -h | --help
    Show the help information about oxcd.

  oxcd --config-file
    Path to the server configuration file. Note that if a configuration file is provided, other command line flags and environment variables will be ignored.
    (not supported by oxcd yet)
";

const SECTIONS: &[(Group, &str)] = &[
    (Group::Member, "Member"),
    (Group::Clustering, "Clustering"),
    (Group::Security, "Security"),
    (Group::Auth, "Auth"),
    (Group::Profiling, "Profiling and Monitoring"),
    (Group::Logging, "Logging"),
    (Group::Tracing, "Experimental distributed tracing"),
    (Group::Proxy, "v2 Proxy (to be deprecated in v3.6)"),
    (Group::Experimental, "Experimental feature"),
    (Group::Unsafe, "Unsafe feature"),
];

/// The whole `--help` text.
pub fn help_text(specs: &[Spec]) -> String {
    let mut out = String::from(USAGE);
    for (group, title) in SECTIONS {
        out.push_str(&format!("\n{title}:\n"));
        for spec in specs.iter().filter(|s| s.group == *group) {
            out.push_str(&format!("  --{}", spec.name));
            if let Some(shown) = spec.shown {
                out.push_str(&format!(" {shown}"));
            }
            out.push('\n');
            for line in spec.usage.lines() {
                out.push_str(&format!("    {line}\n"));
            }
            match spec.effect {
                Effect::Effective => {}
                Effect::NoEffect(why) => {
                    out.push_str(&format!("    [no effect in oxcd: {why}]\n"));
                }
                Effect::Refused(why) => {
                    out.push_str(&format!("    [oxcd takes only the default: {why}]\n"));
                }
            }
        }
    }
    out.push_str(
        "\nCAUTIOUS with unsafe flag! It may break the guarantees given by the consensus protocol!\n",
    );
    out
}
