"""The sidecar's HTTP faces: kube-scheduler's extender verbs and the opt-in admission webhook, with the bounds every connection runs under.

Only translation happens here: JSON in, the Extender's decisions out (server), AdmissionReview
in, a JSON patch out (webhook), each request bounded in size, time and count (limits).
"""
