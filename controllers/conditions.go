package controllers

import (
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// conditioned is an object with kstatus conditions.
type conditioned interface {
	GetGeneration() int64
	GetConditions() []metav1.Condition
	SetConditions([]metav1.Condition)
}

// setCondition sets one condition with the object's generation.
func setCondition(obj conditioned, typ string, status metav1.ConditionStatus, reason, message string) {
	conds := obj.GetConditions()
	apimeta.SetStatusCondition(&conds, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: obj.GetGeneration(),
	})
	obj.SetConditions(conds)
}

// removeCondition drops a condition (kstatus: Reconciling and Stalled exist only while true).
func removeCondition(obj conditioned, typ string) {
	conds := obj.GetConditions()
	apimeta.RemoveStatusCondition(&conds, typ)
	obj.SetConditions(conds)
}

// markReady ends a successful reconcile: Ready=True, no Reconciling or Stalled.
func markReady(obj conditioned, reason, message string) {
	setCondition(obj, v1alpha1.ConditionReady, metav1.ConditionTrue, reason, message)
	removeCondition(obj, v1alpha1.ConditionReconciling)
	removeCondition(obj, v1alpha1.ConditionStalled)
}

// markFailed ends a failed reconcile: Ready=False with the reason; Stalled=True too when
// retrying cannot help until the spec (or a referenced object) changes.
func markFailed(obj conditioned, reason, message string, stalled bool) {
	setCondition(obj, v1alpha1.ConditionReady, metav1.ConditionFalse, reason, message)
	removeCondition(obj, v1alpha1.ConditionReconciling)
	if stalled {
		setCondition(obj, v1alpha1.ConditionStalled, metav1.ConditionTrue, reason, message)
	} else {
		removeCondition(obj, v1alpha1.ConditionStalled)
	}
}
