//! Child processes of the backend (the JIT kernel compiler) that inherit nothing but their
//! standard streams.
//!
//! The host process may hold descriptors without `FD_CLOEXEC`: ggml-rpc's sockets, for one (it
//! creates them with plain `socket`/`accept`). A compiler started inside `ggml-rpc-server` would
//! inherit the client's socket and keep it open after the server died, so the client would wait
//! for the compiler instead of seeing the connection close. This module is under `src/hsa` only
//! because that is where the crate allows unsafe code; it does not touch the HSA runtime.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Marks every descriptor from 3 up close-on-exec in the child `cmd` starts, after its standard
/// streams are set up and before it executes the program, so that the program inherits only
/// stdin, stdout and stderr. The parent's descriptors are not changed.
pub fn inherit_only_stdio(cmd: &mut Command) {
    // Computed here, in the parent: the hook runs between fork and exec, where only
    // async-signal-safe calls are allowed (no allocation, no /proc reading).
    let limit = open_files_limit();
    // SAFETY: the hook makes only async-signal-safe system calls (close_range, fcntl) on the
    // child's own descriptor table and touches no memory shared with other threads. Marking
    // std's error pipe close-on-exec is harmless: it already is.
    unsafe {
        cmd.pre_exec(move || {
            mark_cloexec_from_3(limit);
            Ok(())
        });
    }
}

/// The process's descriptor limit (RLIMIT_NOFILE), for the fallback loop.
fn open_files_limit() -> libc::c_int {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0;
    if ok {
        // Bounded: an unlimited soft limit would make the fallback loop endless.
        rl.rlim_cur.min(1 << 20) as libc::c_int
    } else {
        1024
    }
}

/// `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)` (Linux 5.11), else `FD_CLOEXEC` on each
/// descriptor below `limit` (an EBADF for the ones not open is expected and ignored).
fn mark_cloexec_from_3(limit: libc::c_int) {
    // SAFETY: a raw system call with integer arguments; it only changes descriptor flags.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    } == 0;
    if !done {
        for fd in 3..limit {
            // SAFETY: fcntl on an integer descriptor; a descriptor not open gives EBADF.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::process::Stdio;

    /// A connected socket as ggml-rpc makes them: without FD_CLOEXEC (std sets it on its own).
    pub(crate) fn inheritable_socket() -> (TcpListener, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // SAFETY: fcntl on a descriptor the stream owns and keeps open for the test.
        let cleared = unsafe { libc::fcntl(stream.as_raw_fd(), libc::F_SETFD, 0) };
        assert_eq!(cleared, 0);
        (listener, stream)
    }

    /// Whether a shell started by `cmd` has descriptor `fd` open.
    fn child_has(mut cmd: Command, fd: i32) -> bool {
        let out = cmd
            .arg("-c")
            .arg(format!(
                "test -e /proc/$$/fd/{fd} && echo open || echo closed"
            ))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "open"
    }

    #[test]
    fn a_child_does_not_inherit_the_hosts_sockets() {
        let (_listener, stream) = inheritable_socket();
        let fd = stream.as_raw_fd();
        // The premise: a plain spawn hands the socket to the child.
        assert!(child_has(Command::new("sh"), fd));
        let mut cmd = Command::new("sh");
        inherit_only_stdio(&mut cmd);
        assert!(!child_has(cmd, fd));
        // The parent's descriptor is unchanged (still inheritable).
        assert!(child_has(Command::new("sh"), fd));
    }

    #[test]
    fn the_fallback_loop_marks_the_same_descriptors() {
        let (_listener, stream) = inheritable_socket();
        let fd = stream.as_raw_fd();
        let limit = open_files_limit();
        assert!(limit > fd, "{limit}");
        let mut cmd = Command::new("sh");
        // SAFETY: as in inherit_only_stdio, the loop alone (the path of kernels before 5.11).
        unsafe {
            cmd.pre_exec(move || {
                for fd in 3..limit {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
                Ok(())
            });
        }
        assert!(!child_has(cmd, fd));
    }
}
