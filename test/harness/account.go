package harness

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// Account is the OS user that servers which refuse to run as root
// (PostgreSQL, PgBouncer, Patroni) run as: the current user, or a system
// user when the tests run as root.
type Account struct {
	// Cred is nil when the servers run as the current user.
	Cred *syscall.Credential
	// label starts errors ("pgtest", "hapg"); user is the system user.
	label, user string
	uid, gid    int
}

// ServerAccount is the current user, or when the tests run as root the
// system user name. Its errors start with label; hint says where the user
// comes from and why it is needed.
func ServerAccount(label, name, hint string) (Account, error) {
	a := Account{label: label, user: name}
	if os.Geteuid() != 0 {
		return a, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return Account{}, fmt.Errorf("%s: running as root needs the %q system user (%s): %w", label, name, hint, err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return Account{}, fmt.Errorf("%s: uid %q of user %q: %w", label, u.Uid, name, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return Account{}, fmt.Errorf("%s: gid %q of user %q: %w", label, u.Gid, name, err)
	}
	a.Cred, a.uid, a.gid = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid
	return a, nil
}

// Chown hands path to the account (a no-op when that is us).
func (a Account) Chown(path string) error {
	if a.Cred == nil {
		return nil
	}
	return os.Chown(path, a.uid, a.gid)
}

// Mkdir creates dir (mode 0755) owned by the account.
func (a Account) Mkdir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return a.Chown(dir)
}

// WriteFile creates path with data and perm, owned by the account.
func (a Account) WriteFile(path, data string, perm os.FileMode) error {
	if err := os.WriteFile(path, []byte(data), perm); err != nil {
		return err
	}
	return a.Chown(path)
}

// TempDir makes a fresh temp directory (os.MkdirTemp's pattern) that the
// account can traverse and write, after checking that it can reach it at
// all: root can, so without this check the first server would fail with a
// bare EACCES.
func (a Account) TempDir(pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", fmt.Errorf("%s: creating temp dir: %w", a.label, err)
	}
	if err := errors.Join(a.checkSearchable(dir), os.Chmod(dir, 0o755), a.Chown(dir)); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("%s: preparing %s: %w", a.label, dir, err)
	}
	return dir, nil
}

// checkSearchable reports an ancestor of dir that the account could not
// traverse.
func (a Account) checkSearchable(dir string) error {
	if a.Cred == nil {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("directory %s (mode %v) is not searchable by user %q; "+
				"set TMPDIR to a world-searchable directory such as /tmp", d, fi.Mode().Perm(), a.user)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
