package tenant

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/lockagent/store"
)

// A namespace's pods may reach the database through their cluster's lock
// gateway (lockagent/gateway) instead of with a role of their own: the
// webhook then mints a gateway credential as a generation of the
// namespace's tenant (migration 14), and the namespace's Secret holds the
// gateway's URL with it. The generations, superseding and retiring are the
// roles' (Supersede, Retire, RetireBeyond and Roles serve both).

// gatewayPrefix starts the name of every gateway credential's row. With the
// hash and generation the name is longer than PostgreSQL's 63-byte role
// names, so it never names a login (see migration 14).
const gatewayPrefix = "dislock_lock_gateway_credential_"

// gatewayRowName names the row of a gateway credential.
func gatewayRowName(cluster, namespace string, generation int) string {
	sum := sha256.Sum256([]byte(cluster + "/" + namespace))
	return gatewayPrefix + hex.EncodeToString(sum[:]) + "_g" + strconv.Itoa(generation)
}

// IsGatewayCredential tells a gateway credential's row name from a role's.
func IsGatewayCredential(name string) bool { return strings.HasPrefix(name, gatewayPrefix) }

// GatewayCredential is one generation of a namespace's gateway credential.
type GatewayCredential struct {
	// Name is its row's in dislock.tenants (Roles lists it).
	Name               string
	Namespace, Cluster string
	Generation         int
	// Secret is what a pod proves its namespace with; only its digest is
	// stored.
	Secret string
}

// Digest is what the database keeps of a gateway credential's secret.
func Digest(secret string) [sha256.Size]byte { return sha256.Sum256([]byte(secret)) }

const (
	qInsertGatewayCredential = `INSERT INTO dislock.tenants (role_name, cluster, namespace, generation, created_at, gateway_digest)
VALUES ($1::text, $2::text, $3::text, $4::int, now(), $5::bytea)`

	// qGatewayDigests are the digests of a namespace's live gateway
	// credentials: the one in use and those superseded within the grace.
	qGatewayDigests = `SELECT gateway_digest FROM dislock.tenants
WHERE cluster = $1::text AND namespace = $2::text AND retired_at IS NULL AND gateway_digest IS NOT NULL`
)

// ProvisionGateway mints a new generation of the (cluster, namespace)
// tenant as a gateway credential and returns it; older generations, roles
// or credentials, stay valid until retired.
func ProvisionGateway(ctx context.Context, st *store.Store, cluster, namespace string) (GatewayCredential, error) {
	h := st.Handle()
	if err := validateTenant(cluster, namespace); err != nil {
		return GatewayCredential{}, fmt.Errorf("provisioning a gateway credential: %w", err)
	}
	secret, err := newTenantPassword()
	if err != nil {
		return GatewayCredential{}, err
	}
	c := GatewayCredential{Namespace: namespace, Cluster: cluster, Secret: secret}
	digest := Digest(secret)
	op := fmt.Sprintf("provisioning a gateway credential for namespace %s of cluster %s", namespace, cluster)
	err = tenantTx(ctx, h, op, cluster, namespace, func(tx pgx.Tx) error {
		var err error
		if c.Generation, err = nextGeneration(ctx, tx, cluster, namespace); err != nil {
			return err
		}
		c.Name = gatewayRowName(cluster, namespace, c.Generation)
		_, err = tx.Exec(ctx, qInsertGatewayCredential, c.Name, cluster, namespace, c.Generation, digest[:])
		return err
	})
	if err != nil {
		return GatewayCredential{}, err
	}
	return c, nil
}

// GatewayDigests returns the digests of the (cluster, namespace) tenant's
// live gateway credentials: none when the namespace has none.
func GatewayDigests(ctx context.Context, st *store.Store, cluster, namespace string) ([][sha256.Size]byte, error) {
	h := st.Handle()
	op := fmt.Sprintf("reading the gateway credentials of namespace %s of cluster %s", namespace, cluster)
	rows, err := h.Pool.Query(ctx, qGatewayDigests, cluster, namespace)
	if err != nil {
		return nil, h.Classify(op, err)
	}
	raw, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, h.Classify(op, err)
	}
	out := make([][sha256.Size]byte, 0, len(raw))
	for _, d := range raw {
		if len(d) != sha256.Size {
			return nil, fmt.Errorf("%s: a digest of %d bytes", op, len(d))
		}
		out = append(out, [sha256.Size]byte(d))
	}
	return out, nil
}

// GatewayURL is what a namespace's Secret holds for its pods to reach the
// lock gateway at base (https://host:port) with credential c, trusting the
// certificates in caPEM (the system's roots when empty).
func GatewayURL(base string, caPEM []byte, c GatewayCredential) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("gateway URL %q: %w", base, err)
	}
	switch {
	case u.Scheme != "https" || u.Host == "" || u.Port() == "":
		return "", fmt.Errorf("gateway URL %q: want https://host:port", base)
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("gateway URL %q: want https://host:port, without user, path or query", base)
	case c.Namespace == "" || c.Secret == "":
		return "", errors.New("gateway URL: the credential has no namespace or no secret")
	}
	u.User = url.UserPassword(c.Namespace, c.Secret)
	u.Path = ""
	if len(caPEM) > 0 {
		u.RawQuery = "ca=" + base64.RawURLEncoding.EncodeToString(caPEM)
	}
	return u.String(), nil
}

// GatewayURLFor tells whether url, a namespace Secret's, is one GatewayURL
// made for the gateway at base trusting caPEM: the gateway moved or its CA
// changed when it is not.
func GatewayURLFor(rawURL, base string, caPEM []byte) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	want, err := url.Parse(base)
	if err != nil {
		return false
	}
	ca := ""
	if len(caPEM) > 0 {
		ca = base64.RawURLEncoding.EncodeToString(caPEM)
	}
	return u.Scheme == want.Scheme && u.Host == want.Host && u.Query().Get("ca") == ca
}
