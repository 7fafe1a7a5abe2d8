package controllers

// The permissions of the controller manager. controller-gen reads these markers and writes
// config/rbac/role.yaml (`make manifests`); this file holds nothing else.

// The kinds of reversi.dev, their status and (for foreground deletion of owned objects)
// their finalizers.
// +kubebuilder:rbac:groups=reversi.dev,resources=manifestregistries;toolmanifests;reversigateways;approvalrequests;approvals;reversiruns,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=reversi.dev,resources=manifestregistries/status;toolmanifests/status;reversigateways/status;approvalrequests/status;approvals/status;reversiruns/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=reversi.dev,resources=manifestregistries/finalizers;toolmanifests/finalizers;reversigateways/finalizers;approvalrequests/finalizers;approvals/finalizers;reversiruns/finalizers,verbs=update

// Rendered manifests live in ConfigMaps; git credentials and keys are read from Secrets.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

// Flux sources a ManifestRegistry's spec.sourceRef names are only read (their artifact is
// downloaded from the URL in their status).
// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=gitrepositories;ocirepositories;buckets,verbs=get;list;watch

// What a ReversiGateway owns, and the RBAC its ServiceAccount gets (a Role can only grant
// what its writer holds: the configmaps, secrets, leases and reversi.dev verbs of the gateway
// Role are all held here).
// +kubebuilder:rbac:groups="",resources=serviceaccounts;services;persistentvolumeclaims,verbs=get;list;watch;create;update;patch;delete
// Pods are only read: which pods a gateway has, whether they are ready and which
// ServiceAccount they run as (who gets a Lease). No patch: nothing the controller or a gateway
// does writes a pod.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// Leases wherever gateways are reconciled (every namespace, or the watched ones in a
// namespaced install): one per gateway pod, created, relabelled and deleted (its pod gone) by
// the controller, read for the digest the pod reports on it, and granted to the gateway by
// name (patch: held so it can be granted). In the cluster install this also covers the
// leader-election Lease in the controller's namespace (below).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete

// Kubernetes events on the objects reconciled.
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Leader election: a Lease in the controller's own namespace (kustomize's namespace
// transformer keeps it in step with config/default). The cluster-wide leases rule above holds
// these verbs too; this Role keeps the leader-election right when that rule is narrowed (a
// namespaced controller).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete,namespace=reversi-system

// The controller's own signing key and its Approval stamp key (Secrets it creates on first
// start; read with the cluster-wide secrets get above: grant nobody else read access to
// Secrets in the controller's namespace) and the ConfigMap that publishes its public keys, in
// its own namespace. SelfSubjectReview (who the controller is, for admission) needs no RBAC.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create,namespace=reversi-system
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update,namespace=reversi-system

// ReversiGateway and ManifestRegistry admission (issue 17): the webhooks ask the API server
// whether the author may create Deployments (and claims) and get each Secret the spec names
// (SubjectAccessReview, with the author's user info). Creating a review reads no object and
// grants nothing.
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
