// Wrapper module for building the etcd v3.6.16 server from the Go module proxy
// (used by tests/cluster/build.sh; never imported).
//
// The etcd server's main package is the root of go.etcd.io/etcd/server/v3
// (main.go calls etcdmain.Main, exactly like the upstream `etcd` binary). That
// module's go.mod replaces its sibling modules (api, client/pkg, client/v3,
// pkg) by relative path, which only works inside the etcd git tree; replace
// directives of dependencies are ignored, so requiring it from this wrapper
// uses the published v3.6.16 siblings it already requires.
// Debian's etcd 3.4.23 is below Kubernetes 1.34's supported minimum (3.5+).
module pipectl.local/etcd-wrapper

go 1.26.0

require go.etcd.io/etcd/server/v3 v3.6.16
