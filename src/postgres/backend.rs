//! What the server says outside the replication stream: its errors, and names for the
//! messages pgoutbox did not expect, for error lines.

use std::fmt;

use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend;

/// An error the server sent (ErrorResponse), with the fields operators need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (SQLSTATE {})", self.message, self.code)?;
        if let Some(detail) = &self.detail {
            write!(f, "; {detail}")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "; hint: {hint}")?;
        }
        Ok(())
    }
}

/// Reads an ErrorResponse's fields.
pub(super) fn server_error(
    mut fields: backend::ErrorFields<'_>,
) -> Result<ServerError, std::io::Error> {
    let mut error =
        ServerError { code: String::new(), message: String::new(), detail: None, hint: None };
    while let Some(field) = fields.next()? {
        let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
        match field.type_() {
            b'C' => error.code = value,
            b'M' => error.message = value,
            b'D' => error.detail = Some(value),
            b'H' => error.hint = Some(value),
            _ => {}
        }
    }
    Ok(error)
}

pub(super) fn message_name(message: &backend::Message) -> &'static str {
    use backend::Message as M;
    match message {
        M::AuthenticationGss | M::AuthenticationGssContinue(_) => "GSSAPI authentication",
        M::AuthenticationKerberosV5 => "Kerberos authentication",
        M::AuthenticationSspi => "SSPI authentication",
        M::AuthenticationScmCredential => "SCM credential authentication",
        M::CopyInResponse(_) | M::CopyOutResponse(_) => "COPY response",
        M::DataRow(_) => "DataRow",
        M::RowDescription(_) => "RowDescription",
        M::CommandComplete(_) => "CommandComplete",
        M::ReadyForQuery(_) => "ReadyForQuery",
        _ => "message",
    }
}
