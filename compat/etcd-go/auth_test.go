package etcdcompat

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestAuth: with authentication on (-user), the official client's typed
// errors for a client without credentials and for a wrong password, a
// user limited to one prefix, and a role change seen by a client that is
// already connected.
func TestAuth(t *testing.T) {
	if *userFlag == "" {
		t.Skip("no -user (LATCHKEY_USER): authentication is off")
	}
	admin := client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pfx := fmt.Sprintf("compat/%s/auth/", runID)
	user, role := "compat-"+runID, "compat-role-"+runID

	// No credentials: etcd's "user name is empty".
	anon, err := newClient(endpoints, func(c *clientv3.Config) { c.Username, c.Password = "", "" })
	must(t, err, "client without credentials")
	defer anon.Close()
	if _, err := anon.Get(ctx, pfx+"x"); !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Fatalf("a read without credentials: %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	// A wrong password: the client fails to authenticate when it connects.
	if wrong, err := newClient(endpoints, func(c *clientv3.Config) { c.Password = "wrong" }); err == nil {
		wrong.Close()
		t.Fatal("a client with a wrong password connected")
	} else if !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Fatalf("a wrong password: %v, want %v", err, rpctypes.ErrAuthFailed)
	}

	_, err = admin.UserAdd(ctx, user, "pw-"+runID)
	must(t, err, "user add")
	_, err = admin.RoleAdd(ctx, role)
	must(t, err, "role add")
	_, err = admin.RoleGrantPermission(ctx, role, pfx, clientv3.GetPrefixRangeEnd(pfx), clientv3.PermissionType(clientv3.PermReadWrite))
	must(t, err, "grant readwrite on the prefix")
	_, err = admin.UserGrantRole(ctx, user, role)
	must(t, err, "grant role")
	limited, err := newClient(endpoints, func(c *clientv3.Config) { c.Username, c.Password = user, "pw-"+runID })
	must(t, err, "client as the limited user")
	defer limited.Close()
	_, err = limited.Put(ctx, pfx+"k", "v")
	must(t, err, "put inside the prefix")
	if _, err := limited.Put(ctx, "compat/"+runID+"/outside", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("a put outside the prefix: %v, want %v", err, rpctypes.ErrPermissionDenied)
	}
	roles, err := admin.UserGet(ctx, user)
	must(t, err, "user get")
	if len(roles.Roles) != 1 || roles.Roles[0] != role {
		t.Fatalf("user get: roles %v, want [%s]", roles.Roles, role)
	}
	// Revoked: the connected client's next write is refused.
	_, err = admin.UserRevokeRole(ctx, user, role)
	must(t, err, "revoke role")
	if _, err := limited.Put(ctx, pfx+"k", "v2"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("a put after the role was revoked: %v, want %v", err, rpctypes.ErrPermissionDenied)
	}
	_, err = admin.UserDelete(ctx, user)
	must(t, err, "user delete")
	_, err = admin.RoleDelete(ctx, role)
	must(t, err, "role delete")
}
