"""Tests of scale_gradient: identity forward, gradient times `scale` backward."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from muzero_jax import scale_gradient


def _f(x):
    return jnp.sum(jnp.sin(x) * x**2)


class ScaleGradientTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0.0, 0.25, 0.5, 1.0, 3.0)
    def test_forward_is_identity_and_gradient_is_scaled(self, scale):
        x = jnp.array([0.3, -1.2, 2.0, 0.0])
        forward = self.variant(scale_gradient)
        np.testing.assert_array_equal(forward(x, scale), x)
        g_plain = jax.grad(_f)(x)
        g_scaled = self.variant(jax.grad(lambda v: _f(scale_gradient(v, scale))))(x)
        np.testing.assert_allclose(g_scaled, scale * g_plain, rtol=1e-6, atol=0)

    def test_scale_zero_blocks_and_one_passes(self):
        x = jnp.array([1.5, -0.5])
        np.testing.assert_array_equal(jax.grad(lambda v: _f(scale_gradient(v, 0.0)))(x), 0.0)
        np.testing.assert_allclose(
            jax.grad(lambda v: _f(scale_gradient(v, 1.0)))(x), jax.grad(_f)(x), rtol=1e-7
        )

    def test_traced_scale_under_jit(self):
        x = jnp.array([0.7, -2.0, 1.1])

        @jax.jit
        def g(v, s):
            return jax.grad(lambda u: _f(scale_gradient(u, s)))(v)

        for s in (0.0, 0.1, 0.5, 2.0):
            np.testing.assert_allclose(g(x, jnp.float32(s)), s * jax.grad(_f)(x), rtol=1e-6)

    def test_array_scale_per_element(self):
        x = jnp.array([1.0, 2.0, 3.0])
        s = jnp.array([0.0, 0.5, 2.0])
        g = jax.grad(lambda v: jnp.sum(scale_gradient(v, s) ** 2))(x)
        np.testing.assert_allclose(g, s * 2 * x, rtol=1e-7)

    def test_pytree(self):
        tree = {"a": jnp.array([1.0, -1.0]), "b": (jnp.array(2.0), jnp.ones((2, 2)))}
        out = scale_gradient(tree, 0.5)
        chex.assert_trees_all_equal(out, tree)

        def loss(t):
            t = scale_gradient(t, 0.5)
            return jnp.sum(t["a"] ** 2) + t["b"][0] ** 3 + jnp.sum(t["b"][1])

        g = jax.grad(loss)(tree)
        np.testing.assert_allclose(g["a"], 0.5 * 2 * tree["a"])
        np.testing.assert_allclose(g["b"][0], 0.5 * 3 * 4.0)
        np.testing.assert_allclose(g["b"][1], 0.5 * jnp.ones((2, 2)))

    def test_vmap(self):
        x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
        scales = jnp.array([0.0, 0.5, 1.0, 2.0])
        g = jax.vmap(jax.grad(lambda v, s: _f(scale_gradient(v, s))))(x, scales)
        expected = scales[:, None] * jax.vmap(jax.grad(_f))(x)
        np.testing.assert_allclose(g, expected, rtol=1e-6)

    def test_second_derivative_is_scaled(self):
        # y = scale_gradient(x, s) has value x and derivative dy/dx = s. The
        # first derivative of f(y) is s f'(y(x)); differentiating it again goes
        # through y once more, so the second derivative is s**2 f''(x).
        f = lambda x: jnp.sin(x) * x**3
        x = jnp.float32(0.8)
        for s in (0.0, 0.5, 2.0):
            h = jax.grad(jax.grad(lambda v, s=s: f(scale_gradient(v, s))))(x)
            np.testing.assert_allclose(h, s**2 * jax.grad(jax.grad(f))(x), rtol=1e-5)

    def test_hidden_state_gradient_accumulates_to_half_power_k(self):
        # Toy dynamics h_{k+1} = a * h_k, with the pseudocode's
        # `hidden_state = scale_gradient(hidden_state, 0.5)` after each step.
        # d h_k / d h_0 is a**k without scaling; with it, the gradient that the
        # k-th (scaled) hidden state sends back to h_0 is 0.5**k * a**k.
        a = 1.7
        for k in range(6):

            def unroll(h0, scaled=True, k=k):
                h = h0
                for _ in range(k):
                    h = a * h
                    if scaled:
                        h = scale_gradient(h, 0.5)
                return h

            g = jax.grad(unroll)(jnp.float32(0.3))
            np.testing.assert_allclose(g, 0.5**k * a**k, rtol=1e-6)
            g_plain = jax.grad(lambda h: unroll(h, scaled=False))(jnp.float32(0.3))
            np.testing.assert_allclose(g_plain, a**k, rtol=1e-6)


@pytest.mark.parametrize("scale", [0.5, 1.0 / 3.0])
def test_loss_scaling_of_per_step_losses_binds_each_scale(scale):
    # Late binding bug seen in ports: every step gets the last step's scale.
    scales = [1.0, scale, scale * 2]
    x = jnp.array([1.0, 2.0, 3.0])

    def total(v):
        return sum(scale_gradient(v[i] ** 2, s) for i, s in enumerate(scales))

    np.testing.assert_allclose(
        jax.grad(total)(x), jnp.array(scales) * 2 * x, rtol=1e-6
    )
