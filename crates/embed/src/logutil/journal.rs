//! `--log-outputs systemd/journal`: each log line goes to journald's native
//! socket as etcd's journal writer sends it (client/pkg/logutil/
//! zap_journal.go over go-systemd v22's journal.Send): `PRIORITY` from
//! the level, `MESSAGE` the whole JSON line, `PACKAGE` the caller's
//! directory, `SYSLOG_IDENTIFIER` the program's name. A line journald
//! does not take goes to stderr instead.

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use tracing::Level;

/// go-systemd's journalSocket.
pub(crate) const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

pub(crate) struct JournalWriter {
    /// go-systemd's unconnected socket, sent from with each message.
    socket: UnixDatagram,
    path: PathBuf,
    identifier: String,
}

impl JournalWriter {
    /// etcd's getJournalWriteSyncer: journald must answer at `path` now
    /// (`can't find journal (dial unixgram ...: connect: ...)` otherwise).
    pub(crate) fn connect(path: &Path) -> Result<JournalWriter, String> {
        let refused = |e: io::Error| {
            format!(
                "can't find journal (dial unixgram {}: connect: {})",
                path.display(),
                super::rotate::go_error(&e)
            )
        };
        // systemd.DialJournal: a connection that proves a listener
        UnixDatagram::unbound()
            .and_then(|probe| probe.connect(path))
            .map_err(refused)?;
        let socket = UnixDatagram::unbound().map_err(refused)?;
        let identifier = std::env::args_os()
            .next()
            .map(|arg0| {
                Path::new(&arg0)
                    .file_name()
                    .map(|base| base.to_string_lossy().into_owned())
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        Ok(JournalWriter {
            socket,
            path: path.to_path_buf(),
            identifier,
        })
    }

    /// Sends one JSON log line of `level` logged from `package`; stderr
    /// takes it when journald does not.
    pub(crate) fn write_line(&self, line: &[u8], level: Level, package: &str) {
        let message = fields(line, priority(level), package, &self.identifier);
        if self.send(&message).is_err() {
            let _ = io::stderr().write_all(line);
        }
    }

    fn send(&self, message: &[u8]) -> io::Result<()> {
        match self.socket.send_to(message, &self.path) {
            Ok(_) => Ok(()),
            Err(e) if is_socket_space_error(&e) => self.send_as_file(message),
            Err(e) => Err(e),
        }
    }

    /// go-systemd for a message too large for a datagram: an unlinked file
    /// in /dev/shm holds it, and its descriptor is sent instead.
    fn send_as_file(&self, message: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open("/dev/shm")?;
        file.write_all(message)?;
        send_fd(&self.socket, &self.path, file.as_raw_fd())
    }
}

/// journal.Priority of a zap level (zap_journal.go).
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// journald's native format: `NAME=value\n`, or for a value with a
/// newline (every JSON line ends with one) `NAME\n`, its length as a
/// 64-bit little-endian number, the value and `\n`.
fn fields(line: &[u8], priority: u8, package: &str, identifier: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len() + 96);
    let mut push = |name: &str, value: &[u8]| {
        out.extend_from_slice(name.as_bytes());
        if value.contains(&b'\n') {
            out.push(b'\n');
            out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        } else {
            out.push(b'=');
        }
        out.extend_from_slice(value);
        out.push(b'\n');
    };
    push("PRIORITY", priority.to_string().as_bytes());
    push("MESSAGE", line);
    push("PACKAGE", package.as_bytes());
    push("SYSLOG_IDENTIFIER", identifier.as_bytes());
    out
}

fn is_socket_space_error(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMSGSIZE) | Some(libc::ENOBUFS))
}

/// An empty datagram to `path` carrying `fd` (SCM_RIGHTS).
fn send_fd(socket: &UnixDatagram, path: &Path, fd: libc::c_int) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain C structures, filled within their sizes; every pointer
    // handed to sendmsg lives until it returns.
    unsafe {
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= addr.sun_path.len() {
            return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
        }
        for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
            *dst = *src as libc::c_char;
        }
        let addr_len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as u32;
        let space = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize;
        let mut control = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
        msg.msg_namelen = addr_len;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd);
        if libc::sendmsg(socket.as_raw_fd(), &msg, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_sent_in_journalds_native_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let journald = UnixDatagram::bind(&path).unwrap();
        let writer = JournalWriter::connect(&path).unwrap();
        let line = b"{\"level\":\"warn\",\"msg\":\"x\"}\n";
        writer.write_line(line, Level::WARN, "etcdserver");
        let mut buf = vec![0u8; 4096];
        let n = journald.recv(&mut buf).unwrap();
        let mut expected = b"PRIORITY=4\nMESSAGE\n".to_vec();
        expected.extend_from_slice(&(line.len() as u64).to_le_bytes());
        expected.extend_from_slice(line);
        expected.extend_from_slice(b"\nPACKAGE=etcdserver\nSYSLOG_IDENTIFIER=");
        expected.extend_from_slice(writer.identifier.as_bytes());
        expected.push(b'\n');
        assert_eq!(&buf[..n], &expected[..]);
    }

    #[test]
    fn zap_levels_map_to_etcds_journal_priorities() {
        assert_eq!(priority(Level::DEBUG), 7);
        assert_eq!(priority(Level::INFO), 6);
        assert_eq!(priority(Level::WARN), 4);
        assert_eq!(priority(Level::ERROR), 3);
    }

    #[test]
    fn a_line_too_large_for_a_datagram_is_sent_as_a_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let journald = UnixDatagram::bind(&path).unwrap();
        let writer = JournalWriter::connect(&path).unwrap();
        let fd = tempfile::tempfile().unwrap();
        send_fd(&writer.socket, &path, fd.as_raw_fd()).unwrap();
        // the datagram is empty; the descriptor rides along
        let mut buf = [0u8; 16];
        assert_eq!(journald.recv(&mut buf).unwrap(), 0);
    }

    #[test]
    fn without_journald_the_writer_is_refused_in_etcds_words() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent");
        let e = JournalWriter::connect(&path).err().unwrap();
        assert_eq!(
            e,
            format!(
                "can't find journal (dial unixgram {}: connect: no such file or directory)",
                path.display()
            )
        );
    }
}
