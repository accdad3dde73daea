//! `--database-password-command`: a shell command whose output is the password, run at
//! every new connection, replication and SQL alike, so that passwords that expire (AWS
//! RDS/Aurora IAM tokens, Cloud SQL and Entra tokens, Vault's dynamic credentials) are
//! fresh at each login and a reconnect after one expired just works.
//!
//! The command's password comes before any other (the connection string's, `PGPASSWORD`,
//! the password file). It is never logged, nor is what the command writes to stderr: a
//! token helper's error output (or a `set -x`) can hold a secret, and the error goes to
//! the log and `/readyz`. A command that fails or hangs fails the connection like an
//! unreachable server: fatal at start, retried at a reconnect.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// The command and how long it may take.
#[derive(Debug, Clone)]
pub struct PasswordCommand {
    command: String,
    timeout: Duration,
}

/// Why the command gave no password; one line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswordCommandError {
    #[error("--database-password-command could not be started: {0}")]
    Spawn(String),
    #[error("--database-password-command {status}: {stderr}")]
    Failed { status: String, stderr: String },
    #[error("--database-password-command gave no password within {0:?}; it was killed")]
    TimedOut(Duration),
    #[error("--database-password-command printed no password (stderr: {0})")]
    Empty(String),
}

impl PasswordCommand {
    pub fn new(command: String, timeout: Duration) -> Self {
        PasswordCommand { command, timeout }
    }

    /// Runs the command (`sh -c`), and returns its stdout without the trailing newline.
    pub async fn password(&self) -> Result<String, PasswordCommandError> {
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| PasswordCommandError::Spawn(err.to_string()))?;
        let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
        let outcome = tokio::time::timeout(self.timeout, async {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let read_out = async {
                if let Some(s) = stdout.as_mut() {
                    let _ = s.read_to_end(&mut out).await;
                }
            };
            let read_err = async {
                if let Some(s) = stderr.as_mut() {
                    let _ = s.read_to_end(&mut err).await;
                }
            };
            tokio::join!(read_out, read_err);
            (child.wait().await, out, err)
        })
        .await;
        let Ok((status, out, err)) = outcome else {
            kill_group(&child);
            return Err(PasswordCommandError::TimedOut(self.timeout));
        };
        let status = status.map_err(|err| PasswordCommandError::Spawn(err.to_string()))?;
        if !status.success() {
            return Err(PasswordCommandError::Failed {
                status: status_words(status),
                stderr: one_line(&err),
            });
        }
        let text = String::from_utf8_lossy(&out);
        let password = text.strip_suffix('\n').unwrap_or(&text);
        let password = password.strip_suffix('\r').unwrap_or(password);
        if password.is_empty() {
            return Err(PasswordCommandError::Empty(one_line(&err)));
        }
        Ok(password.to_owned())
    }
}

/// Kills the command and what it started (its process group): a hanging `aws` or `curl`
/// under `sh -c` would otherwise outlive it.
fn kill_group(child: &tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("kill -KILL -- -{pid}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn status_words(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => format!("ended with {status}"),
    }
}

/// What the command wrote to stderr, told without its content (it may hold a secret).
fn one_line(bytes: &[u8]) -> String {
    let lines = String::from_utf8_lossy(bytes).lines().filter(|l| !l.trim().is_empty()).count();
    match lines {
        0 => "nothing on stderr".to_owned(),
        n => format!(
            "{n} line(s) on stderr, not shown since they may hold a secret: run the command by \
             hand to read them"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(text: &str, timeout_ms: u64) -> PasswordCommand {
        PasswordCommand::new(text.to_owned(), Duration::from_millis(timeout_ms))
    }

    #[tokio::test]
    async fn stdout_without_its_newline_is_the_password() {
        let password = command("printf 'to:ken \\n\\n'", 5000).password().await.unwrap();
        assert_eq!(password, "to:ken \n", "only the last newline goes");
        let password = command("echo s3cret", 5000).password().await.unwrap();
        assert_eq!(password, "s3cret");
    }

    #[tokio::test]
    async fn a_failure_shows_the_status_in_one_line_and_never_what_stderr_said() {
        let err = command("echo nope >&2; echo 'token s3cret expired' >&2; exit 3", 5000)
            .password()
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--database-password-command exited with status 3: 2 line(s) on stderr, not shown \
             since they may hold a secret: run the command by hand to read them"
        );
        let err = command("true", 5000).password().await.unwrap_err();
        assert!(matches!(err, PasswordCommandError::Empty(_)), "{err}");
        let err = command("exit 1", 5000).password().await.unwrap_err().to_string();
        assert!(err.ends_with("nothing on stderr"), "{err}");
    }

    #[tokio::test]
    async fn a_hanging_command_is_killed_at_its_timeout() {
        let started = std::time::Instant::now();
        let err = command("sleep 30; echo late", 300).password().await.unwrap_err();
        assert_eq!(err, PasswordCommandError::TimedOut(Duration::from_millis(300)));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
