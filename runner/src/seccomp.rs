//! A seccomp deny-list for the program, installed by the runner on itself just before it
//! starts the program (which inherits it). Pure Rust (seccompiler): no libseccomp, so the
//! runner still builds as one static binary, and the filter is the same in the local
//! sandbox and in Kubernetes pods (where it stacks on RuntimeDefault).
//!
//! Denied with EPERM: mounting and pivoting, new namespaces (unshare, setns, clone with
//! CLONE_NEW* flags), bpf, perf_event_open, keyrings, io_uring, kexec and modules,
//! ptrace and cross-process memory access, userfaultfd, handle-based opens, reboot,
//! swap, accounting, syslog, clock setting, and the TIOCSTI / TIOCLINUX ioctls (compared
//! on their low 32 bits, so the high-bits variant is caught too). clone3 fails with
//! ENOSYS, because its flags live in memory a filter cannot read: libc falls back to
//! clone, whose flags are checked. Everything else is allowed: the sandbox around the
//! runner (namespaces, no capabilities, no_new_privs) is the main boundary; this removes
//! kernel attack surface the programs never need.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// System calls the program never gets.
const DENIED: &[libc::c_long] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_userfaultfd,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_quotactl,
    libc::SYS_lookup_dcookie,
    libc::SYS_vhangup,
];

const CLONE_NEW_FLAGS: [i32; 7] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
];

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("seccomp: {e}"))
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, String> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch()?,
    )
    .map_err(|e| format!("seccomp filter: {e}"))?;
    BpfProgram::try_from(filter).map_err(|e| format!("seccomp filter: {e}"))
}

fn cond(
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| format!("seccomp condition: {e}"))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions).map_err(|e| format!("seccomp rule: {e}"))
}

/// The filters (deny-list with EPERM, clone3 with ENOSYS).
pub fn filters() -> Result<Vec<BpfProgram>, String> {
    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    let mut clone_rules = Vec::new();
    for flag in CLONE_NEW_FLAGS {
        let bit = flag as u64;
        clone_rules.push(rule(vec![cond(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(bit),
            bit,
        )?])?);
    }
    eperm.insert(libc::SYS_clone, clone_rules);
    let mut ioctl_rules = Vec::new();
    for request in [libc::TIOCSTI, libc::TIOCLINUX] {
        ioctl_rules.push(rule(vec![cond(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            request,
        )?])?);
    }
    eperm.insert(libc::SYS_ioctl, ioctl_rules);
    let enosys = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    Ok(vec![
        compile(eperm, libc::EPERM)?,
        compile(enosys, libc::ENOSYS)?,
    ])
}

/// Sets no_new_privs (required to install a filter without privileges) and installs the
/// filters on the calling thread; processes it starts afterwards inherit them.
pub fn install() -> Result<(), String> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    for program in filters()? {
        seccompiler::apply_filter(&program).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        let f = filters().unwrap();
        assert_eq!(f.len(), 2);
        assert!(f.iter().all(|p| !p.is_empty()));
    }
}
