// The calibration fitted online, on the engine's verdicts (issue 81): each verified step tells, for every node the
// draft put beside the path the target took (the children of the root and of each accepted node: drafted or not),
// whether the target's token was it; those outcomes refit the node-score model (scores.hpp) a Newton step at a time,
// from the shipped fit as the prior, forgetting the oldest outcomes at a fixed rate so the fit tracks drift.
//
// A request keeps, from its last draft, the features of the nodes that can be judged (Trial); the next committed
// tokens judge them (Core::learn: at each depth along the path they take, every kept child of the node reached, and
// whether the committed token is it) and each outcome is added to the learner of the request's datastore set. The learner
// holds the decayed sums of a logistic regression's Fisher information and gradient at the coefficients each outcome
// was scored with, S_H and S_g; every kRefitEvery outcomes it takes one Newton step towards the posterior mode under
// a Gaussian prior centred on the prior's coefficients,
//
//   delta = (S_H + lambda I)^-1 (S_g - lambda (w - w0)),   w += delta,   S_g -= S_H delta,
//
// (recursive Newton: the gradient left after the step, to first order), so a node's score always comes from outcomes
// already verified. The token term and the prior's smoothing are the prior's, unchanged. Its Python oracle is
// tests/oracle/online.py.
//
// The fleet shares one fit per datastore (live/fits.py): a fit keeps the outcomes it learnt since its last fold (at
// most OnlineOptions::share of them), and a fold adds them, in order, to the fleet's learner (its state(), read back
// from the database), then becomes that learner: the fleet's fit is one learner over every process's outcomes in the
// order they were folded, and each process goes on from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "scores.hpp"

namespace crest {

// The learner's settings (crest::Options holds each default once).
struct OnlineOptions {
  double strength = 0.0;   // lambda: the prior's weight, in outcomes' worth of Fisher information (0: off)
  double memory = 20000;   // outcomes after which an outcome weighs 1/e (the forgetting rate's inverse)
  int refit_every = 64;    // outcomes between Newton steps
  int64_t share = 0;       // outcomes kept for the next fold (0: none; beyond it, an outcome is not shared)
};

// What a request's last draft can be judged on (Core::capture): the merged table's nodes whose parent is the root or
// a drafted node, each with its features (the calibration's columns, then the model features where the row had a
// state), its logit offset (its token's bias) and its parent's index here (-1: the root; the parents come first).
struct Trial {
  bool with_model = false;
  std::size_t width = 0;            // features per node
  std::vector<int64_t> tokens;      // [n]
  std::vector<int32_t> parents;     // [n]
  std::vector<double> x;            // [n, width]
  std::vector<double> offsets;      // [n]
  void clear() {
    tokens.clear();
    parents.clear();
    x.clear();
    offsets.clear();
  }
};

// One datastore set's fit: the calibration it scores with now (updated in place), and its sums.
class OnlineFit {
 public:
  OnlineFit() = default;
  OnlineFit(const Calibration& prior, OnlineOptions options);
  const Calibration& calibration() const { return now_; }
  // One outcome: the features `x` ([width], the calibration's columns; width is coef.size()) of a node scored with
  // logit offset `offset` (its token's bias), and whether the target took it.
  void add(const double* x, double offset, bool accepted);
  int64_t outcomes() const { return outcomes_; }
  int64_t unshared() const { return unshared_; }  // outcomes learnt but not kept for a fold (share was full)
  // The learner's state, to store: its coefficients, sums and counts, little-endian float64 and int64 (kStateMagic
  // first).
  std::string state() const;
  // Fold (see above): `fleet` is the fleet learner's state (nullptr: none yet, the prior); returns the new one, which
  // this fit now is. Throws std::invalid_argument for a state that is not one of a fit of this width.
  std::string fold(const std::string* fleet);

 private:
  void refit();
  void learn(const double* x, double offset, bool accepted);
  void restore(const std::string& state);
  Calibration prior_, now_;
  OnlineOptions options_;
  std::size_t width_ = 0;          // coefficients and the intercept
  std::vector<double> h_, g_;      // S_H [width^2] (symmetric, full), S_g [width], each divided by scale_
  double scale_ = 1.0, keep_ = 1.0;  // the forgetting applied so far, and one outcome's
  std::vector<double> scratch_, step_;
  std::vector<std::size_t> nonzero_;
  int64_t outcomes_ = 0, pending_ = 0;
  std::vector<double> kept_x_, kept_offsets_;  // the outcomes since the last fold: [kept, width - 1], [kept]
  std::vector<uint8_t> kept_accepted_;
  int64_t unshared_ = 0;
};

}  // namespace crest
